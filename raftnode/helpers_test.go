package raftnode

import (
	"runtime"
	"testing"
	"time"
)

// waitFor polls cond until it holds, failing the test after within. Only
// the tests of goroutine-driven parts (the leader indexer) use it; the
// loop's own tests run in one goroutine and never wait.
func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", within)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}
