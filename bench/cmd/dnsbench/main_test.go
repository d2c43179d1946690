package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fakeServer answers every question with records A records (TC set when
// truncate) on a loopback UDP port.
func fakeServer(t *testing.T, records int, truncate bool) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg).SetReply(r)
		for i := range records {
			rr, _ := dns.NewRR(r.Question[0].Name + " 0 IN A 10.0.0." + string(rune('1'+i)))
			m.Answer = append(m.Answer, rr)
		}
		m.Truncated = truncate
		w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ActivateAndServe()
	}()
	<-started
	t.Cleanup(func() {
		srv.Shutdown()
		<-done
	})
	return pc.LocalAddr().String()
}

// The load generator counts right answers only: each client's answers
// arrive, and a wrong record count or a truncated answer is an error.
func TestDriveChecksAnswers(t *testing.T) {
	qs := questions(2)
	if len(qs) != 4 {
		t.Fatalf("%d questions for 2 services, want A and SRV each", len(qs))
	}
	ctx := context.Background()
	r, err := drive(ctx, fakeServer(t, 3, false), 4, 100*time.Millisecond, 300*time.Millisecond, qs, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.latencies) == 0 || r.errors != 0 || r.qps() <= 0 {
		t.Fatalf("right answers: %d counted, %d errors (%v)", len(r.latencies), r.errors, r.firstErr)
	}
	for _, tc := range []struct {
		records  int
		truncate bool
		want     string
	}{{2, false, "2 records, want 3"}, {3, true, "truncated"}} {
		r, err := drive(ctx, fakeServer(t, tc.records, tc.truncate), 2, 50*time.Millisecond, 200*time.Millisecond, qs, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.latencies) != 0 || r.errors == 0 || !strings.Contains(r.firstErr.Error(), tc.want) {
			t.Fatalf("%d records, tc=%v: %d counted, %d errors, first %v; want every answer an error saying %q",
				tc.records, tc.truncate, len(r.latencies), r.errors, r.firstErr, tc.want)
		}
	}
}

func TestInstances(t *testing.T) {
	in := instances(2, 3)
	if len(in) != 6 || in[4] != (instance{service: "svc1", node: "svc1-n1", addr: "10.1.1.1", port: 8001}) {
		t.Fatalf("instances(2, 3) = %+v", in)
	}
}
