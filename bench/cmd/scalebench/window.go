package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// The memory figure is taken under a trickle of writes, not only after the
// settle. NB: a settled figure is one point of each process's GC sawtooth.
// After the forced cycle a Go runtime keeps the pages its heap goal
// allows, and where in its cycle a process happened to stop loading
// decides how many it had touched: the three members of one cluster,
// holding the same state, could differ by a quarter. Under
// steady writes every member runs several cycles within the window, so
// the mean of its samples is the memory it needs at that size, and the
// peak what it touches.

// window is what the write window yields, per member.
type window struct {
	mean, peak []int64
	writes     int // keys overwritten
}

// underWrites overwrites loaded keys (never the last, which the restarts
// read) with the values they were loaded with, in transactions of
// spec.batch puts from one client on the leader, at rate keys a second
// for d, and samples every member's RSS each settleEvery meanwhile.
func (c *cluster) underWrites(ctx context.Context, spec loadSpec, d time.Duration, rate int) (window, error) {
	conn, err := dial(c.clients[c.leader])
	if err != nil {
		return window{}, err
	}
	defer conn.Close()
	put := c.sys.ops(conn).putBatch
	rng := rand.New(rand.NewPCG(uint64(spec.keys), 1))
	every := time.Duration(float64(time.Second) * float64(spec.batch) / float64(rate))
	puts, samples := time.NewTicker(every), time.NewTicker(settleEvery)
	defer puts.Stop()
	defer samples.Stop()
	end := time.After(d)
	w := window{mean: make([]int64, members), peak: make([]int64, members)}
	sums := make([]int64, members)
	n := 0
	for {
		select {
		case <-ctx.Done():
			return window{}, ctx.Err()
		case <-end:
			if n == 0 {
				return window{}, fmt.Errorf("no RSS sample in a %s window", d)
			}
			for i := range w.mean {
				w.mean[i] = sums[i] / int64(n)
			}
			return w, nil
		case <-samples.C:
			cur, err := c.rss()
			if err != nil {
				return window{}, err
			}
			for i, v := range cur {
				sums[i] += v
				w.peak[i] = max(w.peak[i], v)
			}
			n++
		case <-puts.C:
			keys, values := make([][]byte, spec.batch), make([][]byte, spec.batch)
			for j := range keys {
				k := rng.IntN(max(spec.keys-1, 1))
				keys[j], values[j] = keyOf(k), valueOf(k, spec.size)
			}
			if err := c.putRetrying(ctx, put, keys, values); err != nil {
				return window{}, err
			}
			w.writes += len(keys)
		}
	}
}
