package agent

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lodestone-kv/lodestone/internal/buildinfo"
)

// TestAgentExportsBuildInfo: the agent's /metrics names its build, also
// when its registry already held the metric (shared with another part
// of the process), where it appears once.
func TestAgentExportsBuildInfo(t *testing.T) {
	shared := prometheus.NewRegistry()
	shared.MustRegister(buildinfo.NewCollector())
	cfg := testConfig(&fakeRegistry{}, "127.0.0.15")
	cfg.ListenHTTP = "127.0.0.15:0"
	cfg.Registerer = shared
	a := startAgent(t, cfg)

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + a.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	b := buildinfo.Get()
	want := `lodestone_build_info{commit="` + b.Commit + `",goversion="` + b.GoVersion + `",version="` + b.Version + `"} 1` + "\n"
	if n := strings.Count(string(body), want); n != 1 {
		t.Errorf("/metrics has %d lines %q, want 1", n, want)
	}
}
