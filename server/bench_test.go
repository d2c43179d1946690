package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	rtmetrics "runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// BenchmarkPut64 drives 64 concurrent writers against the leader of an
// in-process three-node cluster (real sockets, real fsync). Use it with
// -cpuprofile to see where a write's CPU goes; compare against etcd with
// make bench-kv.
func BenchmarkPut64(b *testing.B) { benchPut(b, 64) }

// BenchmarkPut1 is one writer: every put is a Raft round of its own, the
// shape of the benchmarks' 1,000 writes/s, so B/op is what one write costs
// the three members' garbage collectors.
func BenchmarkPut1(b *testing.B) { benchPut(b, 1) }

func benchPut(b *testing.B, writers int) {
	c := newTestCluster(b, 3, func(c *Config) { c.TickInterval = DefaultConfig().TickInterval })
	kv := c.kv(c.waitLeader())
	value := make([]byte, 256)
	var n atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for range writers {
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
	st := lead.log.Stats()
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

// BenchmarkConsulBlockingMemory opens 2,000 blocking queries on distinct
// keys through the Consul HTTP API of a single-member cluster and reports
// what they hold while they wait: live heap, goroutine stacks and
// goroutines per query, and the CPU of one full GC cycle with them
// waiting. parked is the default (server/httppark); goroutines is
// NoParking, net/http's handler and background reader per query.
func BenchmarkConsulBlockingMemory(b *testing.B) {
	for _, tc := range []struct {
		name      string
		noParking bool
	}{{"parked", false}, {"goroutines", true}} {
		b.Run(tc.name, func(b *testing.B) {
			c := newTestCluster(b, 1, func(cfg *Config) {
				cfg.NoParking = tc.noParking
				cfg.MaxHTTPConnectionsPerClient = -1 // NB: every query comes from 127.0.0.1
			})
			s := c.servers[c.waitLeader()]
			for range b.N {
				measureBlockingMemory(b, s, 2000)
			}
		})
	}
}

func measureBlockingMemory(b *testing.B, s *Server, n int) {
	resp, err := http.Get("http://" + s.HTTPAddr() + "/v1/kv/mem/none")
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	index := resp.Header.Get("X-Consul-Index")
	inFlight := s.sessionMetrics.blocking.WithLabelValues("http")

	waiting := func() float64 {
		var m dto.Metric
		if err := inFlight.Write(&m); err != nil {
			b.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}
	gcCPU := []rtmetrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	settle := func() (runtime.MemStats, int) {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms, runtime.NumGoroutine()
	}
	before, g0 := settle()
	base := waiting()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		c, err := net.Dial("tcp", s.HTTPAddr())
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
		// NB: the headers the official Consul Go client sends.
		if _, err := fmt.Fprintf(c, "GET /v1/kv/mem/%d?index=%s&wait=5m HTTP/1.1\r\nHost: x\r\nUser-Agent: Go-http-client/1.1\r\nAccept-Encoding: gzip\r\n\r\n", i, index); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	// NB: the queries of an earlier iteration may still be parked (their
	// clients' hang-ups are swept every few seconds): count from now.
	for waiting() < base+float64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("%v of %d queries waiting after 30s", waiting()-base, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	after, g1 := settle()
	rtmetrics.Read(gcCPU)
	cpu0 := gcCPU[0].Value.Float64()
	const cycles = 5
	for range cycles {
		runtime.GC()
	}
	rtmetrics.Read(gcCPU)
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(n), "heap-B/query")
	b.ReportMetric(float64(int64(after.HeapObjects)-int64(before.HeapObjects))/float64(n), "objects/query")
	b.ReportMetric(float64(int64(after.StackInuse)-int64(before.StackInuse))/float64(n), "stack-B/query")
	b.ReportMetric(float64(g1-g0)/float64(n), "goroutines/query")
	b.ReportMetric((gcCPU[0].Value.Float64()-cpu0)/cycles*1000, "gc-cpu-ms/cycle")
}
