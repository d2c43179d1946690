package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// BenchmarkPut64 drives 64 concurrent writers against the leader of an
// in-process three-node cluster (real sockets, real fsync). Use it with
// -cpuprofile to see where a write's CPU goes; compare against etcd with
// make bench-kv.
func BenchmarkPut64(b *testing.B) {
	c := newTestCluster(b, 3, func(c *Config) { c.TickInterval = DefaultConfig().TickInterval })
	kv := c.kv(c.waitLeader())
	value := make([]byte, 256)
	var n atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := n.Add(1)
				if i > int64(b.N) {
					return
				}
				if _, err := kv.Put(context.Background(), &lodestonepb.PutRequest{Key: []byte(fmt.Sprintf("k%d", i)), Value: value}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	lead := c.servers[c.waitLeader()]
	st := lead.node.log.Stats()
	b.ReportMetric(float64(b.N)/float64(st.Commits), "puts/commit")
	b.ReportMetric(float64(st.LastCommitDuration.Microseconds()), "last-commit-µs")
}

// BenchmarkConsulKVGet reads one key through the Consul HTTP API of a
// single-member cluster over a keep-alive connection: the request path a
// re-issued blocking query takes once it wakes (make bench-blocking), less
// the wait.
func BenchmarkConsulKVGet(b *testing.B) {
	c := newTestCluster(b, 1)
	lead := c.waitLeader()
	if _, err := c.kv(lead).Put(context.Background(), &lodestonepb.PutRequest{Key: []byte("bench/key"), Value: []byte("a value of some thirty bytes...")}); err != nil {
		b.Fatal(err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	url := "http://" + c.servers[lead].HTTPAddr() + "/v1/kv/bench/key"
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		resp, err := client.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Consul-Index") == "" {
			b.Fatalf("GET %s: %s, index %q", url, resp.Status, resp.Header.Get("X-Consul-Index"))
		}
	}
}
