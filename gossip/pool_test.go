package gossip

import (
	"bytes"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fastConfig detects failures in about a second on loopback, with slack
// for -race on two cores.
func fastConfig(name string, role Role, ip string) Config {
	c := DefaultConfig()
	c.Name, c.Role, c.BindAddr = name, role, ip+":0"
	c.ProbeInterval = 200 * time.Millisecond
	c.ProbeTimeout = 100 * time.Millisecond
	c.SuspicionMult = 3
	c.SuspicionMaxTimeoutMult = 1
	c.GossipInterval = 50 * time.Millisecond
	c.RetryJoinInterval = 100 * time.Millisecond
	return c
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func startPool(t *testing.T, cfg Config) *Pool {
	t.Helper()
	logs := &lockedBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("start pool %s: %v", cfg.Name, err)
	}
	p.Start()
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close %s: %v", cfg.Name, err)
		}
		if t.Failed() {
			logs.mu.Lock()
			t.Logf("%s logs:\n%s", cfg.Name, logs.b.String())
			logs.mu.Unlock()
		}
	})
	return p
}

// waitState polls p's view of name until it is in want, or fails after
// within. It returns how long it took.
func waitState(t *testing.T, p *Pool, name string, want State, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for {
		for _, m := range p.Members() {
			if m.Name == name && m.State == want {
				return time.Since(start)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not %v within %v; members %+v", p.Name(), name, want, within, p.Members())
		}
		select {
		case <-p.Changed():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestPoolJoinFailLeave(t *testing.T) {
	s := startPool(t, fastConfig("s1", RoleServer, "127.0.0.2"))
	a1cfg := fastConfig("a1", RoleAgent, "127.0.0.3")
	a1cfg.Join = []string{s.Addr()}
	a1 := startPool(t, a1cfg)
	a2cfg := fastConfig("a2", RoleAgent, "127.0.0.4")
	a2cfg.Join = []string{a1.Addr()} // any member will do
	a2 := startPool(t, a2cfg)

	for _, p := range []*Pool{s, a1, a2} {
		for _, name := range []string{"s1", "a1", "a2"} {
			waitState(t, p, name, StateAlive, 5*time.Second)
		}
	}
	for _, m := range s.Members() {
		want := RoleAgent
		if m.Name == "s1" {
			want = RoleServer
		}
		if m.Role != want {
			t.Fatalf("%s role = %q, want %q (from its metadata)", m.Name, m.Role, want)
		}
	}

	// A crash: sockets close with no goodbye.
	bound := s.Config().DetectionBound(3)
	if err := a1.Close(); err != nil {
		t.Fatal(err)
	}
	took := waitState(t, s, "a1", StateFailed, bound)
	t.Logf("crash detected after %v (bound %v)", took, bound)

	// A graceful departure.
	if err := a2.Leave(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitState(t, s, "a2", StateLeft, 2*time.Second)

	if got := membersGauge(t, s, "failed"); got != 1 {
		t.Fatalf("lodestone_gossip_members{state=failed} = %v, want 1", got)
	}
}

// membersGauge reads p's member gauge for one state through Collect.
func membersGauge(t *testing.T, p *Pool, state string) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	p.Collect(ch)
	close(ch)
	for m := range ch {
		if m.Desc() != p.membersDesc {
			continue
		}
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		if pb.GetLabel()[0].GetValue() == state {
			return pb.GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge for state %q", state)
	return 0
}

func TestPoolRejectsWrongKey(t *testing.T) {
	key1 := "MTIzNDU2Nzg5MDEyMzQ1Ng==" // "1234567890123456"
	key2 := "NjU0MzIxMDk4NzY1NDMyMQ==" // "6543210987654321"
	scfg := fastConfig("s1", RoleServer, "127.0.0.2")
	scfg.EncryptKey = key1
	s := startPool(t, scfg)

	for _, tc := range []struct{ name, key string }{{"wrong-key", key2}, {"no-key", ""}} {
		cfg := fastConfig(tc.name, RoleAgent, "127.0.0.5")
		cfg.EncryptKey = tc.key
		p := startPool(t, cfg)
		if n, err := p.Join([]string{s.Addr()}); err == nil {
			t.Fatalf("%s joined an encrypted pool (%d answered)", tc.name, n)
		}
	}

	// Positive control: a member with the right key joins, and once the
	// server sees it, gossip has run while the others were knocking.
	gcfg := fastConfig("good", RoleAgent, "127.0.0.6")
	gcfg.EncryptKey = key1
	gcfg.Join = []string{s.Addr()}
	g := startPool(t, gcfg)
	waitState(t, s, "good", StateAlive, 5*time.Second)
	waitState(t, g, "s1", StateAlive, 5*time.Second)
	for _, p := range []*Pool{s, g} {
		for _, m := range p.Members() {
			if m.Name == "wrong-key" || m.Name == "no-key" {
				t.Fatalf("%s lists %s: %+v", p.Name(), m.Name, p.Members())
			}
		}
	}
}

func TestPoolDetectionIsConfigurable(t *testing.T) {
	// Slower probing must take measurably longer to declare a crash.
	measure := func(interval time.Duration, ip string) time.Duration {
		cfg := fastConfig("s-"+ip, RoleServer, ip)
		cfg.ProbeInterval, cfg.ProbeTimeout = interval, interval/2
		s := startPool(t, cfg)
		acfg := fastConfig("a-"+ip, RoleAgent, ip)
		acfg.ProbeInterval, acfg.ProbeTimeout = interval, interval/2
		acfg.Join = []string{s.Addr()}
		a := startPool(t, acfg)
		waitState(t, s, acfg.Name, StateAlive, 5*time.Second)
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		return waitState(t, s, acfg.Name, StateFailed, cfg.DetectionBound(2))
	}
	fast := measure(100*time.Millisecond, "127.0.0.7")
	slow := measure(400*time.Millisecond, "127.0.0.8")
	t.Logf("detection: %v at 100ms probes, %v at 400ms probes", fast, slow)
	if slow <= fast {
		t.Fatalf("slow probing detected in %v, not slower than fast probing (%v)", slow, fast)
	}
}

func ExampleConfig_DetectionBound() {
	c := DefaultConfig()
	fmt.Println(c.DetectionBound(3))
	// Output: 27.8s
}
