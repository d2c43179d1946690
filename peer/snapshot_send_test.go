package peer

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// reportingNode is a Node that passes on each snapshot report.
type reportingNode struct {
	testNode
	reports chan raft.SnapshotStatus
}

func (n reportingNode) ReportSnapshot(_ uint64, st raft.SnapshotStatus) { n.reports <- st }

// failingAtEnd reads r and returns err instead of io.EOF at its end, as a
// raftlog.SnapshotReader does for a file whose CRC does not match.
type failingAtEnd struct {
	r      io.Reader
	err    error
	closed bool
}

func (f *failingAtEnd) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if errors.Is(err, io.EOF) {
		err = f.err
	}
	return n, err
}

func (f *failingAtEnd) Close() error { f.closed = true; return nil }

// TestSendSnapshotStreamsReader: SendSnapshot streams the data from its
// reader in chunks to the peer, which steps the MsgSnap, and closes the
// reader; a reader that fails at its end (a damaged file) fails the send
// before the trailer, so the peer steps nothing.
func TestSendSnapshotStreamsReader(t *testing.T) {
	p := newIdentityPort(t, Config{MaxSnapshotBytes: 64 << 20, MaxSnapshotChunks: 64})
	node := reportingNode{reports: make(chan raft.SnapshotStatus, 1)}
	sender := newTestTransport(2, node, prometheus.NewRegistry())
	defer sender.Close()
	if err := sender.SetPeer(1, p.addr); err != nil {
		t.Fatal(err)
	}
	data := stateOf(t, testCluster, 5)
	m := raftpb.Message{Type: raftpb.MsgSnap, From: 2, To: 1, Term: 3,
		Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 5, Term: 3, ConfState: raftpb.ConfState{Voters: []uint64{1, 2}}}}}
	wait := func() raft.SnapshotStatus {
		t.Helper()
		select {
		case st := <-node.reports:
			return st
		case <-time.After(30 * time.Second):
			t.Fatal("no snapshot report")
			return 0
		}
	}

	good := &failingAtEnd{r: bytes.NewReader(data), err: io.EOF}
	sender.SendSnapshot(m, good, int64(len(data)))
	if st := wait(); st != raft.SnapshotFinish {
		t.Fatalf("report %v, want SnapshotFinish", st)
	}
	if got := p.steps.Load(); got != 1 || !good.closed {
		t.Fatalf("peer stepped %d messages, reader closed %v; want 1, true", got, good.closed)
	}

	damaged := &failingAtEnd{r: bytes.NewReader(data), err: errors.New("checksum mismatch")}
	sender.SendSnapshot(m, damaged, int64(len(data)))
	if st := wait(); st != raft.SnapshotFailure {
		t.Fatalf("report %v, want SnapshotFailure", st)
	}
	if got := p.steps.Load(); got != 1 || !damaged.closed {
		t.Fatalf("peer stepped %d messages, reader closed %v; want still 1, true", got, damaged.closed)
	}
}
