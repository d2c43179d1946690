package server

import (
	"fmt"
	"sync"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

func TestConfigGRPCStreamWorkers(t *testing.T) {
	for _, n := range []int{-1, 0, 1, DefaultGRPCStreamWorkers, MaxGRPCStreamWorkers} {
		cfg := singleMemberConfig(t)
		cfg.GRPCStreamWorkers = n
		if err := cfg.Validate(); err != nil {
			t.Errorf("grpc-stream-workers %d refused: %v", n, err)
		}
	}
	for _, n := range []int{-2, MaxGRPCStreamWorkers + 1} {
		cfg := singleMemberConfig(t)
		cfg.GRPCStreamWorkers = n
		if err := cfg.Validate(); err == nil {
			t.Errorf("grpc-stream-workers %d accepted", n)
		}
	}
	if got := streamWorkers(0); got != DefaultGRPCStreamWorkers {
		t.Errorf("streamWorkers(0) = %d, want the default %d", got, DefaultGRPCStreamWorkers)
	}
	if got := streamWorkers(-1); got != 0 {
		t.Errorf("streamWorkers(-1) = %d, want 0 (a goroutine per call)", got)
	}
}

// TestStreamWorkersServeMoreCallsThanWorkers holds more linearizable
// reads in flight than there are workers, with workers off, and with the
// default: every call is answered with what was written before it.
func TestStreamWorkersServeMoreCallsThanWorkers(t *testing.T) {
	for _, workers := range []int{2, -1, 0} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			c := newTestCluster(t, 3, func(cfg *Config) { cfg.GRPCStreamWorkers = workers })
			lead := c.waitLeader()
			kv := c.kv(lead)
			put(t, kv, "k", "v1")
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for i := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := kv.Get(ctxT(t), &lodestonepb.GetRequest{Key: []byte("k"), Consistency: lodestonepb.Consistency_LINEARIZABLE})
					if err == nil && string(resp.GetKv().GetValue()) != "v1" {
						err = fmt.Errorf("get %d read %q, want v1", i, resp.GetKv().GetValue())
					}
					if err != nil {
						errs <- err
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}
