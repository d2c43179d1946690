package main

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
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
	m, err := harness.ReadMetrics(r, roundsMetric, readsMetric)
	if err != nil {
		return 0, 0, err
	}
	return m[roundsMetric], m[readsMetric], nil
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
