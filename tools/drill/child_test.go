package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/client"
	lodestone "github.com/lodestone-kv/lodestone/server"
)

// TestMain lets the population tests run this test binary as the drill's
// child process, as the drill runs its own binary.
func TestMain(m *testing.M) {
	if os.Getenv("DRILL_TEST_POPULATION") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestAnswer: the child counts clients served after the time asked and
// watchers at or past the index asked, refuses a line it does not
// understand without stopping, and stops on "stop".
func TestAnswer(t *testing.T) {
	f := &fleet{lastOK: make([]atomic.Int64, 3), watchIdx: make([]atomic.Int64, 2)}
	base := time.Unix(1000, 0)
	f.lastOK[0].Store(base.Add(time.Second).UnixNano())
	f.lastOK[1].Store(base.Add(3 * time.Second).UnixNano())
	f.watchIdx[0].Store(7)
	f.watchIdx[1].Store(9)
	for _, tc := range []struct {
		line, want string
		stop       bool
	}{
		{"served 0 0", "served 2 2", false},
		{"served " + strconv.FormatInt(base.Add(2*time.Second).UnixNano(), 10) + " 8", "served 1 1", false},
		{"served " + strconv.FormatInt(base.Add(time.Hour).UnixNano(), 10) + " 10", "served 0 0", false},
		{"served x 1", "error bad served arguments", false},
		{"served 1", "error unknown command", false},
		{"reconnect", "error unknown command", false},
		{"stop", "stopped", true},
	} {
		got, stop := answer(f, tc.line)
		if !strings.HasPrefix(got, tc.want) || stop != tc.stop {
			t.Errorf("answer(%q) = %q, %v; want %q..., %v", tc.line, got, stop, tc.want, tc.stop)
		}
	}
}

// TestPopulationProcess runs the population as a child process against
// a real one-member server: its clients get served and its watchers
// follow the ticked key, a bad command gets an error and changes
// nothing, and "stop" ends the process cleanly.
func TestPopulationProcess(t *testing.T) {
	peer, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	cfg := lodestone.DefaultConfig()
	cfg.TickInterval = 20 * time.Millisecond
	cfg.Name, cfg.DataDir, cfg.ListenPeer = "n1", t.TempDir(), peer
	cfg.ListenGRPC, cfg.ListenHTTP = "127.0.0.1:0", "127.0.0.1:0"
	cfg.InitialCluster = map[string]string{"n1": peer}
	srv, err := lodestone.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer srv.Close()
	admin, err := client.New(client.Config{Endpoints: []string{srv.GRPCAddr()}, RequestTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx := context.Background()
	if _, err := admin.Put(ctx, "drill/key/0", []byte("v")); err != nil {
		t.Fatalf("seed: %v", err)
	}

	t.Setenv("DRILL_TEST_POPULATION", "1")
	o := options{clients: 4, watchers: 2, keys: 1, interval: 100 * time.Millisecond}
	since := time.Now()
	p, err := startPopulation([]string{srv.GRPCAddr()}, o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		select {
		case <-p.done:
		default:
			p.kill()
		}
	}()
	resp, err := admin.Put(ctx, "drill/tick/now", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	index := resp.GetKv().GetModifyIndex()
	deadline := time.Now().Add(time.Minute)
	for {
		cl, wa, err := p.served(since, index)
		if err != nil {
			t.Fatal(err)
		}
		if cl == 4 && wa == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("served %d/4 clients, %d/2 watchers at index %d within a minute", cl, wa, index)
		}
		// The watchers may have attached after the put: tick again.
		if resp, err = admin.Put(ctx, "drill/tick/now", []byte("2")); err == nil {
			index = resp.GetKv().GetModifyIndex()
		}
		time.Sleep(50 * time.Millisecond)
	}
	if cl, wa, err := p.served(time.Now().Add(time.Hour), index+1000); err != nil || cl != 0 || wa != 0 {
		t.Errorf("served after an hour from now, past index+1000: %d, %d, %v; want 0, 0", cl, wa, err)
	}
	if _, err := p.ask("served soon 1", "served"); err == nil || !strings.Contains(err.Error(), "bad served arguments") {
		t.Errorf("a bad command: %v; want the child's error", err)
	}
	if cl, _, err := p.served(since, index); err != nil || cl != 4 {
		t.Errorf("after a bad command: %d clients, %v; want 4 (nothing changed)", cl, err)
	}
	// NB: /proc counts CPU in clock ticks (10ms each), so a child that
	// has done little yet reads 0; each tick's events keep its watchers
	// working until one is counted.
	for deadline := time.Now().Add(10 * time.Second); ; {
		cpu, err := p.cpu()
		if err != nil {
			t.Fatalf("child CPU: %v", err)
		}
		if cpu > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child CPU still %v after 10s of ticks; want some", cpu)
		}
		if _, err := admin.Put(ctx, "drill/tick/now", []byte("3")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.stop()
	select {
	case <-p.done:
	default:
		t.Fatal("the child still runs after stop")
	}
	if !p.cmd.ProcessState.Success() {
		t.Errorf("the child exited with %v", p.cmd.ProcessState)
	}
}
