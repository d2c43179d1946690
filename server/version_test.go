package server

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/buildinfo"
)

// TestBuildShownEverywhere: the Status RPC, the Consul API's agent/self
// (read with the official client) and /metrics all name this build.
func TestBuildShownEverywhere(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	b := buildinfo.Get()

	st, err := c.cluster(lead).Status(ctxT(t), &lodestonepb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetVersion() != b.Version {
		t.Errorf("Status version %q, want %q", st.GetVersion(), b.Version)
	}

	self, err := consulClient(t, c, lead).Agent().Self()
	if err != nil {
		t.Fatalf("agent/self: %v", err)
	}
	for field, want := range map[string]string{"Version": b.Version, "Revision": b.Commit, "BuildDate": b.Date, "NodeName": lead} {
		if got := self["Config"][field]; got != want {
			t.Errorf("agent/self Config.%s = %v, want %q", field, got, want)
		}
	}

	resp, err := http.Get("http://" + c.servers[lead].HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := `lodestone_build_info{commit="` + b.Commit + `",goversion="` + b.GoVersion + `",version="` + b.Version + `"} 1`
	if !strings.Contains(string(body), want+"\n") {
		t.Errorf("/metrics has no line %q", want)
	}
}
