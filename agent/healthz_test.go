package agent

import (
	"io"
	"net/http"
	"testing"
)

// /healthz answers 200 while the agent serves, for container probes.
func TestAgentHealthz(t *testing.T) {
	cfg := testConfig(&fakeRegistry{}, "127.0.0.15")
	cfg.ListenHTTP = "127.0.0.15:0"
	a := startAgent(t, cfg)
	resp, err := http.Get("http://" + a.HTTPAddr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
		t.Fatalf("GET /healthz: %d %q, want 200 \"ok\\n\"", resp.StatusCode, body)
	}
}
