package demo_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/gateway"
	"github.com/lodestone-kv/lodestone/gateway/demo"
	"github.com/lodestone-kv/lodestone/server/servertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemoBehindGateway: Run registers the demo instances in the catalog
// and the route, the gateway balances over both, and ending ctx
// deregisters them.
func TestDemoBehindGateway(t *testing.T) {
	srv := servertest.Start(t, nil)
	c, err := client.New(client.Config{Endpoints: []string{srv.GRPCAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	gcfg := gateway.DevConfig()
	gcfg.Listen, gcfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- demo.Run(runCtx, demo.Config{Client: c, Gateway: gcfg, Ready: func(proxy, admin string, _ []string) { ready <- proxy }})
	}()
	var proxy string
	select {
	case proxy = <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}

	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	seen := map[string]bool{}
	for range 50 {
		resp, err := hc.Get("http://" + proxy + "/hello")
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Instance, Path string }
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != 200 || body.Path != "/hello" {
			t.Fatalf("demo through the gateway: %d %+v", resp.StatusCode, body)
		}
		seen[body.Instance] = true
	}
	if len(seen) != 2 {
		t.Errorf("answers came from %v, want both demo instances", seen)
	}
	resp, err := hc.Get("http://" + proxy + "/stream?n=3")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if got := len(b); got == 0 || resp.ContentLength != -1 {
		t.Errorf("stream: %d bytes, content length %d", got, resp.ContentLength)
	}

	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	r, err := c.Health(ctx, demo.Service, client.HealthFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(r.GetInstances()); n != 0 {
		t.Errorf("%d demo instances still registered after Run returned", n)
	}
}
