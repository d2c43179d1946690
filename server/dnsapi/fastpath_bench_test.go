package dnsapi

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// BenchmarkUDPAnswers asks a 10-instance service's A and SRV over
// loopback from 16 closed-loop clients, each with its own socket, and
// reports the process's CPU (user and system, clients included: they
// cost the same in every case) per answer:
//
//   - handler: a server on a wildcard address, miekg/dns's server alone
//   - single: the fast path reading and writing a datagram per call
//   - batch: the fast path with recvmmsg and sendmmsg (Linux)
//
// Compare with: go test -run '^$' -bench UDPAnswers -count 6 ./server/dnsapi
func BenchmarkUDPAnswers(b *testing.B) {
	c := newCatalog(b)
	for i := range 10 {
		c.register(fmt.Sprintf("n%d", i), fmt.Sprintf("10.0.0.%d", i+1), fmt.Sprintf("web%d", i), "web", "", uint32(8000+i), passing)
	}
	for _, tc := range []struct {
		name  string
		addr  string
		batch func(*net.UDPConn) (batchConn, error)
	}{
		{"handler", "0.0.0.0:0", nil},
		{"single", "127.0.0.1:0", newSingleConn},
		{"batch", "127.0.0.1:0", newBatchConn},
	} {
		b.Run(tc.name, func(b *testing.B) {
			addr := benchServer(b, c, tc.addr, tc.batch)
			var qs [][]byte
			for _, qtype := range []uint16{dns.TypeA, dns.TypeSRV} {
				q := new(dns.Msg).SetQuestion("web.service.consul.", qtype)
				q.SetEdns0(1232, false)
				wire, _ := q.Pack()
				for range variantUses + 2 {
					exchangeRaw(b, addr, wire) // NB: keeps the answers
				}
				qs = append(qs, wire)
			}
			const clients = 16
			var left atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			before := cpuTime(b)
			b.ResetTimer()
			for i := range clients {
				conn, err := net.Dial("udp", addr)
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					defer conn.Close()
					buf := make([]byte, 4096)
					for n := i; left.Add(-1) >= 0; n++ {
						conn.SetDeadline(time.Now().Add(5 * time.Second))
						if _, err := conn.Write(qs[n%len(qs)]); err != nil {
							b.Error(err)
							return
						}
						if _, err := conn.Read(buf); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(b.N), "cpu-us/answer")
		})
	}
}

// benchServer serves c on addr, its fast path reading with batch.
func benchServer(b *testing.B, c *catalog, addr string, batch func(*net.UDPConn) (batchConn, error)) string {
	l, err := Listen(addr)
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(c, l, DefaultConfig(), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	if s.fast != nil {
		s.fast.newBatch = batch
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ServeUDP()
	}()
	b.Cleanup(func() {
		s.Close()
		<-done
	})
	_, port, _ := net.SplitHostPort(s.Addr())
	return net.JoinHostPort("127.0.0.1", port)
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
