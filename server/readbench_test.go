package server

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// BenchmarkGet64 drives 64 concurrent linearizable gets of one key
// against the leader of an in-process three-node cluster (real sockets):
// reads/round says how many reads share one ReadIndex round (a heartbeat
// to every follower), the figure that sets a linearizable read's cost.
// Use it with -cpuprofile and -benchmem.
func BenchmarkGet64(b *testing.B) { benchGet(b, 64, lodestonepb.Consistency_LINEARIZABLE) }

// BenchmarkGetStale64 is BenchmarkGet64 without the round: the rest of a
// get's cost.
func BenchmarkGetStale64(b *testing.B) { benchGet(b, 64, lodestonepb.Consistency_STALE) }

func benchGet(b *testing.B, readers int, consistency lodestonepb.Consistency) {
	c := newTestCluster(b, 3, func(c *Config) { c.TickInterval = DefaultConfig().TickInterval })
	name := c.waitLeader()
	kv := c.kv(name)
	if _, err := kv.Put(context.Background(), &lodestonepb.PutRequest{Key: []byte("k"), Value: make([]byte, 256)}); err != nil {
		b.Fatal(err)
	}
	reg := c.servers[name].Registry()
	rounds0 := histogramCount(b, reg, "lodestone_read_index_batch_size")
	var n atomic.Int64
	cpu0 := processCPU()
	b.ResetTimer()
	var wg sync.WaitGroup
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &lodestonepb.GetRequest{Key: []byte("k"), Consistency: consistency}
			for n.Add(1) <= int64(b.N) {
				if _, err := kv.Get(context.Background(), req); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	// NB: the process's CPU, all three members and the clients: robust to
	// a busy machine where the wall clock is not.
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	if rounds := histogramCount(b, reg, "lodestone_read_index_batch_size") - rounds0; rounds > 0 {
		b.ReportMetric(float64(b.N)/rounds, "reads/round")
	}
}

// histogramCount is the count of observations of the histogram name in g.
func histogramCount(b *testing.B, g prometheus.Gatherer, name string) float64 {
	b.Helper()
	mfs, err := g.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += float64(m.GetHistogram().GetSampleCount())
			}
			return sum
		}
	}
	b.Fatalf("metric %s not found", name)
	return 0
}
