package peer

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lodestone-kv/lodestone/internal/clusterid"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// testCluster is the cluster of the tests' transports.
var testCluster = clusterid.Derive("peer tests", map[string]string{"a": "a:1"})

// testNode is a Node whose parts a test sets; unset parts do nothing.
type testNode struct {
	step    func(context.Context, raftpb.Message) error
	removed func()
}

func (n testNode) Step(ctx context.Context, m raftpb.Message) error {
	if n.step == nil {
		return nil
	}
	return n.step(ctx, m)
}
func (testNode) ReportUnreachable(uint64)                   {}
func (testNode) ReportSnapshot(uint64, raft.SnapshotStatus) {}
func (testNode) Dropped(raftpb.Message)                     {}
func (n testNode) MarkRemoved() {
	if n.removed != nil {
		n.removed()
	}
}

// newTestTransport is a Transport for member self feeding n, with its
// metrics on reg.
func newTestTransport(self uint64, n Node, reg prometheus.Registerer) *Transport {
	t := NewTransport(Config{Self: self, Registerer: reg, Cluster: testCluster})
	t.SetNode(n)
	return t
}

// gathered sums the samples of one counter family in g.
func gathered(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
