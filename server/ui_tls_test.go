package server

import (
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"
)

// With TLS on every port and client certificates required on HTTP, the
// Cluster page of one member still reads every other member's /metrics
// (over TLS, presenting its peer certificate): no member is shown
// unreachable.
func TestUIClusterPageOverMutualTLS(t *testing.T) {
	f := newTLSFixture(t)
	c := newTestCluster(t, 3, withTLS(f, true))
	c.creds = f.clientCreds(t)
	lead := c.waitLeader()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: rawTLS(t, f.caFile, &f.client)}, Timeout: 5 * time.Second}
	role := regexp.MustCompile(`data-member="([^"]+)" data-role="([^"]+)"`)
	var roles map[string]string
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := hc.Get("https://" + c.servers[lead].HTTPAddr() + "/ui/cluster")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/ui/cluster over TLS: %s", resp.Status)
		}
		roles = map[string]string{}
		for _, m := range role.FindAllStringSubmatch(string(body), -1) {
			roles[m[1]] = m[2]
		}
		if len(roles) == 3 && allReached(roles) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("members on %s's cluster page over mutual TLS: %v, want 3, none unreachable", lead, roles)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func allReached(roles map[string]string) bool {
	for _, r := range roles {
		if r != "leader" && r != "follower" {
			return false
		}
	}
	return true
}
