package gateway_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/gateway"
	"github.com/lodestone-kv/lodestone/gateway/gatewaytest"
)

// TestRegistryOutageServesLastTable: when the source loses the registry
// the gateway keeps routing by its last table, reports it stale (growing
// with the clock), and on reconnect resumes from its index: no full
// reload, and the changes made meanwhile arrive.
func TestRegistryOutageServesLastTable(t *testing.T) {
	a := startOrigin(t, nameHandler("a"), false)
	b := startOrigin(t, nameHandler("b"), false)
	src := fakeWithRoute("svc")
	idx := src.PutInstance(a.instance("svc", "a", nil))
	clk := gatewaytest.NewClock(time.Unix(5000, 0))
	cfg := testConfig(t, src)
	cfg.Clock = clk
	g := startGateway(t, cfg)
	ctx := testCtx(t, 10*time.Second)
	g.WaitIndex(ctx, idx)
	// NB: the table can hold the index before the feed reports itself
	// connected; staleness is about the latter.
	if err := g.WaitConnected(ctx, true); err != nil {
		t.Fatal(err)
	}
	c := httpClient(t)
	if g.Staleness() != 0 {
		t.Fatalf("staleness %v while connected, want 0", g.Staleness())
	}

	src.Disconnect()
	if err := g.WaitConnected(ctx, false); err != nil {
		t.Fatal(err)
	}
	clk.Advance(42 * time.Second)
	if got, want := g.Staleness(), 42*time.Second; got != want {
		t.Errorf("staleness %v after 42s of outage, want %v", got, want)
	}
	resp, err := httpClient(t).Get("http://" + g.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m := readAll(t, resp)
	for _, want := range []string{"gateway_table_staleness_seconds 42", "gateway_registry_connected 0"} {
		if !contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for range 10 {
		if resp, body := get(t, c, g, "x", "/"); resp.StatusCode != http.StatusOK || body != "a /" {
			t.Fatalf("during the outage: %d %q, want the last table's origin", resp.StatusCode, body)
		}
	}

	// Changes made while the gateway cannot see them.
	src.PutInstance(b.instance("svc", "b", nil))
	idx = src.DeleteInstance("svc", "a")
	src.Reconnect()
	if err := g.WaitIndex(ctx, idx); err != nil {
		t.Fatal(err)
	}
	if err := g.WaitConnected(ctx, true); err != nil {
		t.Fatal(err)
	}
	if g.Staleness() != 0 {
		t.Errorf("staleness %v after reconnecting, want 0", g.Staleness())
	}
	if got := src.Resets(); got != 1 {
		t.Errorf("the source sent %d full loads, want 1 (the resume must not reload)", got)
	}
	if _, body := get(t, c, g, "x", "/"); body != "b /" {
		t.Errorf("after the outage: %q, want the new origin b", body)
	}
}

// TestColdStartFromPersistedTable: a gateway that starts while the
// registry is down serves the table an earlier run persisted, reports how
// old it is, and resumes from its index when the registry returns.
func TestColdStartFromPersistedTable(t *testing.T) {
	a := startOrigin(t, nameHandler("a"), false)
	b := startOrigin(t, nameHandler("b"), false)
	dir := t.TempDir()
	src := fakeWithRoute("svc")
	idx := src.PutInstance(a.instance("svc", "a", nil))
	clk := gatewaytest.NewClock(time.Unix(5000, 0))
	{
		cfg := testConfig(t, src)
		cfg.StateDir, cfg.Clock = dir, clk
		g, err := gateway.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		g.Start()
		g.WaitIndex(testCtx(t, 10*time.Second), idx)
		if err := g.Close(); err != nil { // persists on the way out
			t.Fatal(err)
		}
	}
	src.Disconnect()
	clk.Advance(time.Hour)
	cfg := testConfig(t, src)
	cfg.StateDir, cfg.Clock = dir, clk
	g := startGateway(t, cfg)
	if !g.Ready() || g.Index() != idx {
		t.Fatalf("cold start: ready=%v index=%d, want ready at %d", g.Ready(), g.Index(), idx)
	}
	if got := g.Staleness(); got != time.Hour {
		t.Errorf("cold start staleness %v, want 1h (since the table was saved)", got)
	}
	c := httpClient(t)
	if _, body := get(t, c, g, "x", "/"); body != "a /" {
		t.Fatalf("cold start with the registry down: %q, want the persisted origin", body)
	}
	resets := src.Resets()
	idx = src.PutInstance(b.instance("svc", "b", nil))
	idx = max(idx, src.DeleteInstance("svc", "a"))
	src.Reconnect()
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	if got := src.Resets(); got != resets {
		t.Errorf("reconnecting after a cold start made %d full loads, want none (resume from the persisted index)", got-resets)
	}
	if _, body := get(t, c, g, "x", "/"); body != "b /" {
		t.Errorf("after reconnecting: %q, want b", body)
	}
}
