package peer

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/clusterid"
)

// Probe passes a member of this cluster and one that joins it without
// its id yet; it names the reason for a closed port and another cluster.
func TestProbe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prober := NewTransport(Config{Self: 9, Cluster: testCluster})
	defer prober.Close()

	same := newIdentityPort(t, Config{})
	if err := prober.Probe(ctx, same.addr); err != nil {
		t.Errorf("probe of a member of this cluster: %v", err)
	}
	joining := newIdentityPort(t, Config{OnLearn: func(clusterid.ID) error { return nil }})
	if err := prober.Probe(ctx, joining.addr); err != nil {
		t.Errorf("probe of a joining member: %v", err)
	}
	if same.steps.Load() != 0 || joining.steps.Load() != 0 {
		t.Error("a probe reached Raft")
	}

	other := newIdentityPort(t, Config{Cluster: otherCluster})
	if err := prober.Probe(ctx, other.addr); err == nil || !strings.Contains(err.Error(), "refused this member's cluster") {
		t.Errorf("probe of another cluster's member: %v, want a refusal", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	if err := prober.Probe(ctx, closed); err == nil || !strings.Contains(err.Error(), closed) {
		t.Errorf("probe of a closed port: %v, want an error naming %s", err, closed)
	}
}
