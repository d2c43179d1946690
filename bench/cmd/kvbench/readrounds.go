package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// The leader's ReadIndex rounds: each is a heartbeat to every follower
// and their answers, and every linearizable read waits for one. How many
// reads (ReadIndex calls: a GetMany is one) shared a round sets much of a
// get's server cost, and it moves with what else the servers run, so a
// read workload's line says what it was.
const (
	roundsMetric = "lodestone_read_index_batch_size_count"
	readsMetric  = "lodestone_read_index_batch_size_sum"
)

// readRounds returns the leader's rounds and the reads they carried so
// far.
func (c *cluster) readRounds(ctx context.Context) (rounds, reads float64, err error) {
	url := c.httpBase(c.http[slices.Index(c.clients, c.leader)]) + "/metrics"
	resp, err := c.httpGet(ctx, url)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	return parseReadRounds(resp.Body)
}

// parseReadRounds reads the two counts from metrics text.
func parseReadRounds(r io.Reader) (rounds, reads float64, err error) {
	found := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, v, _ := strings.Cut(sc.Text(), " ")
		var dst *float64
		switch name {
		case roundsMetric:
			dst = &rounds
		case readsMetric:
			dst = &reads
		default:
			continue
		}
		if *dst, err = strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil {
			return 0, 0, fmt.Errorf("%s: %w", name, err)
		}
		found++
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("metrics lack %s or %s", roundsMetric, readsMetric)
	}
	return rounds, reads, nil
}

// startReadRounds reads the leader's counts and returns a func that
// reports the rounds a second and the reads a round since, as a run
// line's note; "" for a system without them, a window with no round, or
// a failed scrape.
func (c *cluster) startReadRounds(ctx context.Context) func(seconds float64) string {
	if !c.sys.readRounds {
		return func(float64) string { return "" }
	}
	rounds0, reads0, err0 := c.readRounds(ctx)
	return func(seconds float64) string {
		rounds1, reads1, err1 := c.readRounds(ctx)
		if err0 != nil || err1 != nil || rounds1 <= rounds0 || seconds <= 0 {
			return ""
		}
		rounds := rounds1 - rounds0
		return fmt.Sprintf(" read-rounds=%.0f/s reads-per-round=%.2f", rounds/seconds, (reads1-reads0)/rounds)
	}
}
