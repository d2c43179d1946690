package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"
)

// lodestone demo serves one instance that names itself in its answers and
// has a /health for agents' checks; it stops cleanly when interrupted.
func TestDemoServesNamedInstance(t *testing.T) {
	addr := testnet.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--listen", addr, "--name", "demo-7"}, strings.NewReader(""), &out, &errb, func(string) string { return "" })
	}()
	base := "http://" + addr
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := cli(t, nil, "", "healthcheck", "--url", base+"/health")
		if r.code == 0 {
			break
		}
		select {
		case code := <-done:
			t.Fatalf("demo exited %d before serving: %s", code, errb.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health not healthy within 10s: %s", r.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Get(base + "/some/path")
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Instance string `json:"instance"`
		Path     string `json:"path"`
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || body.Instance != "demo-7" || body.Path != "/some/path" {
		t.Fatalf("GET /some/path: %d %+v %v, want 200 from demo-7", resp.StatusCode, body, err)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("demo exited %d after interrupt, want 0: %s", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("demo did not stop within 10s of its interrupt")
	}
	if !strings.Contains(out.String(), "instance demo-7") {
		t.Errorf("stdout %q, want it to name the instance", out.String())
	}
}

func TestDemoRefusesBadFlags(t *testing.T) {
	busy := testnet.FreeAddr(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--name", ""}, "--name is empty"},
		{[]string{"--listen", "nowhere"}, "--listen nowhere"},
		{[]string{"--log-level", "loud"}, "--log-level"},
	} {
		r := cli(t, nil, "", append([]string{"demo", "--listen", busy}, tc.args...)...)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("demo %v: exit %d stderr %q, want 1 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}
