package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// TestConsulKVReadsRouting: the KV reads served ahead of the mux
// (consulapi.KVReads) answer as the mux's route does, and every request
// the shortcut does not take still reaches the mux: a path the mux
// redirects, a write, another datacenter.
func TestConsulKVReadsRouting(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	if _, err := c.kv(lead).Put(context.Background(), &lodestonepb.PutRequest{Key: []byte("r/a"), Value: []byte("va")}); err != nil {
		t.Fatal(err)
	}
	base := "http://" + c.servers[lead].HTTPAddr()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	resp, body := do(http.MethodGet, "/v1/kv/r/a")
	var got []struct {
		Key         string
		Value       string
		ModifyIndex uint64
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil || resp.StatusCode != 200 || len(got) != 1 || got[0].Key != "r/a" ||
		got[0].Value != base64.StdEncoding.EncodeToString([]byte("va")) {
		t.Fatalf("GET r/a: %d %q (%v)", resp.StatusCode, body, err)
	}
	for name, h := range map[string]string{"X-Consul-Index": "", "X-Consul-Knownleader": "true", "X-Consul-Lastcontact": "0",
		"Content-Type": "application/json", "Content-Length": ""} {
		if v := resp.Header.Get(name); v == "" || (h != "" && v != h) {
			t.Errorf("GET r/a: %s %q, want %q", name, v, h)
		}
	}
	if resp.TransferEncoding != nil {
		t.Errorf("GET r/a: Transfer-Encoding %v, want a Content-Length", resp.TransferEncoding)
	}
	if resp, _ := do(http.MethodGet, "/v1/kv/r/missing"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET a missing key: %d, want 404", resp.StatusCode)
	}
	// The mux redirects a path that is not clean; so must the shortcut.
	for _, p := range []string{"/v1/kv/r//a", "/v1/kv/r/./a", "/v1/kv/x/../r/a"} {
		if resp, _ := do(http.MethodGet, p); resp.StatusCode/100 != 3 || resp.Header.Get("Location") != "/v1/kv/r/a" {
			t.Errorf("GET %s: %d to %q, want the mux's redirect to /v1/kv/r/a", p, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	if resp, body := do(http.MethodGet, "/v1/kv/r/a?dc=elsewhere"); resp.StatusCode != 500 || body != "No path to datacenter\n" {
		t.Errorf("GET in another dc: %d %q", resp.StatusCode, body)
	}
	if resp, body := do(http.MethodPut, "/v1/kv/r/b"); resp.StatusCode != 200 || body != "true\n" {
		t.Errorf("PUT r/b: %d %q", resp.StatusCode, body)
	}
	if resp, _ := do(http.MethodPost, "/v1/kv/r/a"); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST r/a: %d, want 405", resp.StatusCode)
	}
}
