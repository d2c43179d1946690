package server

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/clusterid"
	"github.com/lodestone-kv/lodestone/internal/member"
)

// Every founding member derives the same id, keeps it on disk, and a
// member that joins learns it, keeps it and has it after a restart.
func TestClusterIDAgreedAndLearned(t *testing.T) {
	c := newTestCluster(t, 3)
	want := clusterid.Derive("", c.peers)
	for _, n := range c.names {
		if got := c.servers[n].ClusterID(); got != want {
			t.Fatalf("%s is in cluster %s, want %s", n, got, want)
		}
		if got, ok, err := clusterid.Load(c.dirs[n]); err != nil || !ok || got != want {
			t.Fatalf("%s's data dir says %s (%v, %v), want %s", n, got, ok, err, want)
		}
		if got := c.servers[n].Store().ClusterID(); got != want {
			t.Fatalf("%s's store names cluster %s, want %s", n, got, want)
		}
	}
	via := c.follower()
	addr := c.add("n4")
	if err := retryUnavailable(t, func(ctx context.Context) error {
		_, err := c.cluster(via).AddMember(ctx, &lodestonepb.AddMemberRequest{Name: "n4", PeerAddr: addr})
		return err
	}); err != nil {
		t.Fatalf("add n4: %v", err)
	}
	c.start("n4", true)
	last := put(t, c.kv(via), "after-n4", "x").Header.Index
	c.waitApplied("n4", last)
	if got := c.servers["n4"].ClusterID(); got != want {
		t.Fatalf("joined n4 is in cluster %s, want %s", got, want)
	}
	if got, ok, err := clusterid.Load(c.dirs["n4"]); err != nil || !ok || got != want {
		t.Fatalf("n4's data dir says %s (%v, %v), want %s", got, ok, err, want)
	}
	c.stop("n4")
	// NB: a restart with --join still set, as an operator's unit file
	// keeps it: the id comes from the data dir, not from a peer.
	c.start("n4", true)
	if got := c.servers["n4"].ClusterID(); got != want {
		t.Fatalf("n4 restarted in cluster %s, want %s", got, want)
	}
	last = put(t, c.kv(via), "after-restart", "x").Header.Index
	c.waitApplied("n4", last)
}

// A damaged id file stops the server rather than letting it guess.
func TestDamagedClusterIDFileRefused(t *testing.T) {
	cfg := testConfig()
	cfg.Name, cfg.DataDir = "a", t.TempDir()
	cfg.ListenPeer, cfg.ListenGRPC, cfg.ListenHTTP = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.InitialCluster = map[string]string{"a": "127.0.0.1:0"}
	if err := os.WriteFile(filepath.Join(cfg.DataDir, clusterid.FileName), []byte("not an id\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := New(cfg)
	if err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("New with a damaged cluster-id file: %v, want it refused as damaged", err)
	}
}

// soloServer starts a one-member cluster named name, on its own.
func soloServer(t *testing.T, name string) *Server {
	t.Helper()
	cfg := testConfig()
	cfg.Name, cfg.DataDir = name, filepath.Join(t.TempDir(), name)
	cfg.ListenPeer, cfg.ListenGRPC, cfg.ListenHTTP = freeAddr(t), "127.0.0.1:0", "127.0.0.1:0"
	cfg.InitialCluster = map[string]string{name: cfg.ListenPeer}
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Close() })
	waitFor(t, 10*time.Second, func() bool { return s.raft.Status().Lead != 0 })
	return s
}

func refusedCount(t *testing.T, reg prometheus.Gatherer, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lodestone_peer_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// memberState is what must not change in a cluster that refuses a peer.
func memberState(s *Server) string {
	var b bytes.Buffer
	for _, m := range s.Store().Members() {
		b.WriteString(m.Name + "=" + m.PeerAddr + ";")
	}
	return b.String()
}

// A member of a second cluster cannot reach the first: its Raft
// messages, its conf change and its snapshot are refused with errors that
// name both clusters, and the first cluster's state does not move.
func TestAnotherClustersMemberRefused(t *testing.T) {
	c := newTestCluster(t, 1)
	a := c.servers["n1"]
	put(t, c.kv("n1"), "k", "v")
	other := soloServer(t, "x1")
	aID, bID := a.ClusterID(), other.ClusterID()
	if aID == bID || aID.IsZero() || bID.IsZero() {
		t.Fatalf("two one-member clusters got ids %s and %s", aID, bID)
	}
	before, index, term := memberState(a), a.Store().Index(), a.raft.Status().Term
	names := []string{aID.String(), bID.String()}

	// Raft messages, through the other member's own transport.
	if err := other.transport.SetPeer(a.ID(), a.PeerAddr()); err != nil {
		t.Fatal(err)
	}
	other.transport.Send(raftpb.Message{Type: raftpb.MsgHeartbeat, From: other.ID(), To: a.ID(), Term: term + 100})
	waitFor(t, 5*time.Second, func() bool { return refusedCount(t, a.Registry(), "cluster_mismatch") > 0 })

	// A conf change, through its transport's connection (which names its cluster).
	client, ok := other.transport.Client(a.ID())
	if !ok {
		t.Fatal("no client to the first cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := client.ChangeConf(ctx, &lodestonepb.ConfChangeRequest{Change: addMemberChange(t, "evil", "127.0.0.1:1")})
	wantBoth(t, err, names)

	// A snapshot of its own state.
	err = sendSnapshot(ctx, client, bID, other)
	wantBoth(t, err, names)

	if got := memberState(a); got != before {
		t.Errorf("members went from %s to %s", before, got)
	}
	if st := a.raft.Status(); st.Term >= term+100 || a.Store().Index() < index {
		t.Errorf("term %d index %d after refusals, were %d and %d", st.Term, a.Store().Index(), term, index)
	}
	if got := get(t, c.kv("n1"), "k", lodestonepb.Consistency_LINEARIZABLE); got == nil || string(got.Value) != "v" {
		t.Errorf("k = %v after refusals", got)
	}
}

// A process that dials the peer port with no cluster id is refused: a
// forged conf change and a forged snapshot change nothing.
func TestForgedPeerRefused(t *testing.T) {
	c := newTestCluster(t, 1)
	a := c.servers["n1"]
	before, index := memberState(a), a.Store().Index()
	cc, err := grpc.NewClient(a.PeerAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := lodestonepb.NewPeerClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = client.ChangeConf(ctx, &lodestonepb.ConfChangeRequest{Change: addMemberChange(t, "evil", "127.0.0.1:1")})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "no cluster id") {
		t.Fatalf("forged conf change: %v, want PermissionDenied for no cluster id", err)
	}
	// NB: claiming the right cluster in the stream's header alone does not help.
	err = sendSnapshot(ctx, client, a.ClusterID(), a)
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("forged snapshot: %v, want PermissionDenied", err)
	}
	if refusedCount(t, a.Registry(), "no_cluster_id") < 2 {
		t.Error("refusals not counted")
	}
	if got := memberState(a); got != before || a.Store().Index() < index {
		t.Errorf("members went from %s to %s", before, got)
	}
	for _, m := range a.Store().Members() {
		if m.Name == "evil" {
			t.Fatal("the forged member was added")
		}
	}
}

func wantBoth(t *testing.T, err error, ids []string) {
	t.Helper()
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("err = %v, want PermissionDenied", err)
	}
	for _, id := range ids {
		if !strings.Contains(err.Error(), id) {
			t.Errorf("err = %v, want it to name cluster %s", err, id)
		}
	}
}

// addMemberChange is a marshaled conf change adding a voter.
func addMemberChange(t *testing.T, name, addr string) []byte {
	t.Helper()
	id := member.ID(name)
	cctx, err := proto.Marshal(&lodestonepb.ConfChangeContext{Member: &lodestonepb.Member{Id: id, Name: name, PeerAddr: addr}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := (&raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode, NodeID: id}}, Context: cctx}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sendSnapshot streams src's state as a snapshot claiming cluster id in
// its header, and returns the receiver's answer.
func sendSnapshot(ctx context.Context, c lodestonepb.PeerClient, id clusterid.ID, src *Server) error {
	var data bytes.Buffer
	if _, err := src.Store().Snapshot().WriteTo(&data); err != nil {
		return err
	}
	m := raftpb.Message{Type: raftpb.MsgSnap, From: src.ID(), To: member.ID("n1"), Term: 1000,
		Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: src.Store().Index(), Term: 1000}}}
	hb, err := m.Marshal()
	if err != nil {
		return err
	}
	st, err := c.Snapshot(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&lodestonepb.SnapshotChunk{Message: hb, ClusterId: id[:], Size: uint64(data.Len())}); err != nil && !errors.Is(err, context.Canceled) {
		_, rerr := st.CloseAndRecv()
		return rerr
	}
	st.Send(&lodestonepb.SnapshotChunk{Data: data.Bytes()})
	st.Send(&lodestonepb.SnapshotChunk{Last: true})
	_, err = st.CloseAndRecv()
	return err
}

func TestConfigPeerSnapshotLimits(t *testing.T) {
	cfg := singleMemberConfig(t)
	cfg.MaxPeerSnapshotBytes = 0
	var ce *ConfigError
	if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != "max-peer-snapshot-bytes" {
		t.Errorf("bytes 0: %v", err)
	}
	cfg = singleMemberConfig(t)
	cfg.MaxPeerSnapshotBytes, cfg.MaxPeerSnapshotChunks = 100<<20, 50
	if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != "max-peer-snapshot-chunks" {
		t.Errorf("too few chunks for the bytes: %v", err)
	}
	cfg.MaxPeerSnapshotChunks = 102
	if err := cfg.Validate(); err != nil {
		t.Errorf("enough chunks: %v", err)
	}
}

func TestConfigSnapshotBytes(t *testing.T) {
	var ce *ConfigError
	for _, bad := range []uint64{1, MinSnapshotBytes - 1} {
		cfg := singleMemberConfig(t)
		cfg.SnapshotBytes = bad
		if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != "snapshot-bytes" {
			t.Errorf("snapshot-bytes %d: %v", bad, err)
		}
	}
	for _, good := range []uint64{0, MinSnapshotBytes, DefaultConfig().SnapshotBytes} {
		cfg := singleMemberConfig(t)
		cfg.SnapshotBytes = good
		if err := cfg.Validate(); err != nil {
			t.Errorf("snapshot-bytes %d: %v", good, err)
		}
	}
}

func TestConfigRaftLogCacheBytes(t *testing.T) {
	var ce *ConfigError
	cfg := singleMemberConfig(t)
	cfg.RaftLogCacheBytes = MinRaftLogCacheBytes - 1
	if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != "raft-log-cache-bytes" {
		t.Errorf("raft-log-cache-bytes below the minimum: %v", err)
	}
	cfg.RaftLogCacheBytes = MinRaftLogCacheBytes
	if err := cfg.Validate(); err != nil {
		t.Errorf("raft-log-cache-bytes at the minimum: %v", err)
	}
}

func TestConfigWatchHistory(t *testing.T) {
	var ce *ConfigError
	cfg := singleMemberConfig(t)
	cfg.Watch.RetainEvents = -1
	if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != "watch-history-events" {
		t.Errorf("watch-history-events -1: %v", err)
	}
	cfg = singleMemberConfig(t)
	cfg.Watch.RetainBytes = -1
	if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != "watch-history-bytes" {
		t.Errorf("watch-history-bytes -1: %v", err)
	}
	cfg.Watch.RetainBytes = 0
	if err := cfg.Validate(); err != nil {
		t.Errorf("watch-history-bytes 0 (the default): %v", err)
	}
}
