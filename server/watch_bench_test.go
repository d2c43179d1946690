package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// BenchmarkWatchFanout is bench-watch's shape at a tenth of the size, in
// one process: a single-node server, 100 streams over 2 connections,
// 10,000 exact watchers on 1,000 keys (10 per key, on one stream) plus 10
// watchers of the whole prefix; b.N writes from 16 writers. It waits for
// every delivery and reports the process's CPU time (server and client
// side together) per write, and per delivery. Run with -cpuprofile to see
// where it goes.
func BenchmarkWatchFanout(b *testing.B) {
	for _, tc := range []struct {
		name     string
		watchers bool
		interval time.Duration
	}{
		{"none", false, DefaultConfig().WatchDeliveryInterval},
		{"grid=0", true, 0},
		{"grid=2ms", true, 2 * time.Millisecond},
		{"grid=5ms", true, 5 * time.Millisecond},
	} {
		b.Run(tc.name, func(b *testing.B) {
			benchWatchFanout(b, tc.watchers, tc.interval)
		})
	}
}

func benchWatchFanout(b *testing.B, watchers bool, interval time.Duration) {
	const (
		streams  = 100
		conns    = 2
		keys     = 1000
		exact    = 10_000
		prefixes = 10
		writers  = 16
	)
	c := newTestCluster(b, 1, func(cfg *Config) {
		cfg.MaxWatchesPerConnection = exact + prefixes
		cfg.MaxWatchesPerStream = exact
		cfg.WatchDeliveryInterval = interval
	})
	lead := c.waitLeader()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var ccs []*grpc.ClientConn
	for range conns {
		cc, err := grpc.NewClient(c.servers[lead].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		ccs = append(ccs, cc)
	}
	var delivered, created atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var ss []lodestonepb.Watch_WatchClient
	for i := range streams {
		s, err := lodestonepb.NewWatchClient(ccs[i%conns]).Watch(ctx)
		if err != nil {
			b.Fatal(err)
		}
		ss = append(ss, s)
		wg.Go(func() {
			for {
				r, err := s.Recv()
				if err != nil {
					return
				}
				if r.Created {
					created.Add(1)
				}
				n := len(r.Events)
				for _, g := range r.Groups {
					n += len(g.Events)
				}
				delivered.Add(int64(n))
			}
		})
	}
	create := func(s lodestonepb.Watch_WatchClient, id int64, key string, prefix bool) {
		if err := s.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: &lodestonepb.WatchCreate{
			WatchId: id, Key: []byte(key), Prefix: prefix, Grouped: true}}}); err != nil {
			b.Fatal(err)
		}
	}
	if !watchers {
		ss = nil
	}
	for j := range exact * len(ss) / streams {
		create(ss[j%streams], int64(j+1), fmt.Sprintf("disc/svc-%05d", j%keys), false)
	}
	for i := range prefixes * len(ss) / streams {
		create(ss[i*streams/prefixes], int64(exact+i+1), "disc/", true)
	}
	for created.Load() < int64((exact+prefixes)*len(ss)/streams) {
		time.Sleep(time.Millisecond)
	}

	kv := c.kv(lead)
	value := make([]byte, 64)
	cpu0 := processCPU()
	b.ResetTimer()
	var next atomic.Int64
	var wwg sync.WaitGroup
	for range writers {
		wwg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				key := fmt.Sprintf("disc/svc-%05d", i*7919%keys)
				if _, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte(key), Value: value}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wwg.Wait()
	want := int64(b.N) * (exact/keys + prefixes) * int64(len(ss)) / streams
	deadline := time.Now().Add(time.Minute)
	for delivered.Load() < want && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	if got := delivered.Load(); got != want {
		b.Fatalf("delivered %d events, want %d", got, want)
	}
	cpu := processCPU() - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/write")
	if want > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(want), "cpu-ns/delivery")
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
