package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"
)

// TestReadyFollowsTheQuorum: Ready and /readyz say the same, ready with
// a leader and ErrNoLeader once the quorum is gone (the leader steps down
// under CheckQuorum), while Healthy holds throughout.
func TestReadyFollowsTheQuorum(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	s := c.servers[lead]
	readyz := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + s.HTTPAddr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Reason string `json:"reason"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body.Reason
	}
	waitFor(t, 5*time.Second, func() bool { return s.Ready() == nil })
	if code, reason := readyz(); code != http.StatusOK || reason != "" {
		t.Fatalf("ready member: /readyz %d %q", code, reason)
	}
	for _, f := range c.followersOf(lead) {
		c.stop(f)
	}
	waitFor(t, 10*time.Second, func() bool { return errors.Is(s.Ready(), ErrNoLeader) })
	if code, reason := readyz(); code != http.StatusServiceUnavailable || reason != ErrNoLeader.Error() {
		t.Errorf("member without a quorum: /readyz %d %q, want 503 %q", code, reason, ErrNoLeader)
	}
	if err := s.Healthy(); err != nil {
		t.Errorf("Healthy = %v, want nil while the Raft loop runs", err)
	}
}
