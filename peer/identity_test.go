package peer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"hash/crc32"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/clusterid"
	"github.com/lodestone-kv/lodestone/store"
)

// countingLocal counts the calls that got past the checks.
type countingLocal struct{ calls atomic.Int64 }

func (l *countingLocal) ChangeConf(context.Context, raftpb.ConfChangeV2, *lodestonepb.Member) (uint64, error) {
	l.calls.Add(1)
	return 7, nil
}
func (l *countingLocal) TransferLeader(context.Context, uint64) (uint64, error) {
	l.calls.Add(1)
	return 1, nil
}
func (l *countingLocal) LeaderIndex(uint64) (uint64, uint64, error) {
	l.calls.Add(1)
	return 1, 1, nil
}

// identityPort is a real peer port of member 1 in testCluster, counting
// what reaches its Raft node and its Local.
type identityPort struct {
	t     *Transport
	reg   *prometheus.Registry
	local *countingLocal
	steps atomic.Int64
	addr  string
}

func newIdentityPort(tb testing.TB, cfg Config) *identityPort {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &identityPort{reg: prometheus.NewRegistry(), local: &countingLocal{}, addr: ln.Addr().String()}
	cfg.Self, cfg.Registerer = 1, p.reg
	if cfg.Cluster.IsZero() && cfg.OnLearn == nil {
		cfg.Cluster = testCluster
	}
	p.t = NewTransport(cfg)
	p.t.SetNode(testNode{step: func(context.Context, raftpb.Message) error { p.steps.Add(1); return nil }})
	port := NewPort(ln, p.t, p.local, func() []*lodestonepb.Member { return nil }, slog.New(slog.DiscardHandler))
	go port.Serve()
	tb.Cleanup(func() {
		port.Close()
		p.t.Close()
	})
	return p
}

func (p *identityPort) refused(tb testing.TB, reason string) float64 {
	tb.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		tb.Fatal(err)
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

// client dials p with no cluster id, as a forger would, or with id.
func (p *identityPort) client(tb testing.TB) lodestonepb.PeerClient {
	tb.Helper()
	cc, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cc.Close() })
	return lodestonepb.NewPeerClient(cc)
}

func withID(ctx context.Context, id clusterid.ID) context.Context {
	return metadata.AppendToOutgoingContext(ctx, clusterMD, id.String())
}

var otherCluster = clusterid.Derive("another", map[string]string{"b": "b:1"})

func wantRefusal(t *testing.T, err error, code codes.Code, texts ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("err = %v, want code %v", err, code)
	}
	for _, s := range texts {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("err = %v, want it to name %q", err, s)
		}
	}
}

func TestPeerCallsNeedThisCluster(t *testing.T) {
	p := newIdentityPort(t, Config{})
	c := p.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc := raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode, NodeID: 99}}}
	cc.Context, _ = proto.Marshal(&lodestonepb.ConfChangeContext{Member: &lodestonepb.Member{Id: 99, Name: "evil", PeerAddr: "127.0.0.1:1"}})
	change, _ := cc.Marshal()

	// A forged call names no cluster.
	_, err := c.ChangeConf(ctx, &lodestonepb.ConfChangeRequest{Change: change})
	wantRefusal(t, err, codes.PermissionDenied, "no cluster id", testCluster.String())
	_, err = c.TransferLeader(ctx, &lodestonepb.TransferLeaderRequest{})
	wantRefusal(t, err, codes.PermissionDenied, "no cluster id")
	_, err = c.LeaderIndex(ctx, &lodestonepb.LeaderIndexRequest{})
	wantRefusal(t, err, codes.PermissionDenied, "no cluster id")
	st, err := c.LeaderIndexStream(ctx)
	if err == nil {
		st.Send(&lodestonepb.LeaderIndexRequest{})
		_, err = st.Recv()
	}
	wantRefusal(t, err, codes.PermissionDenied, "no cluster id")

	// Another cluster's member: both ids named.
	_, err = c.ChangeConf(withID(ctx, otherCluster), &lodestonepb.ConfChangeRequest{Change: change})
	wantRefusal(t, err, codes.PermissionDenied, "peer is in cluster "+otherCluster.String(), "this server is in cluster "+testCluster.String())

	// A member of this cluster announcing a member of another.
	cc.Context, _ = proto.Marshal(&lodestonepb.ConfChangeContext{Member: &lodestonepb.Member{Id: 99, Name: "evil"}, ClusterId: otherCluster[:]})
	foreign, _ := cc.Marshal()
	_, err = c.ChangeConf(withID(ctx, testCluster), &lodestonepb.ConfChangeRequest{Change: foreign})
	wantRefusal(t, err, codes.PermissionDenied, "announced for cluster "+otherCluster.String())

	if n := p.local.calls.Load(); n != 0 {
		t.Fatalf("%d refused calls reached the member", n)
	}
	if _, err := c.ChangeConf(withID(ctx, testCluster), &lodestonepb.ConfChangeRequest{Change: change}); err != nil {
		t.Fatalf("a call of this cluster: %v", err)
	}
	if got := p.refused(t, refusedNoCluster); got != 4 {
		t.Errorf("refused no_cluster_id = %v, want 4", got)
	}
	if got := p.refused(t, refusedCluster) + p.refused(t, refusedMemberCluster); got != 2 {
		t.Errorf("refused cluster_mismatch + member_cluster = %v, want 2", got)
	}
}

func TestRaftStreamNeedsThisCluster(t *testing.T) {
	p := newIdentityPort(t, Config{})
	send := func(preamble []byte) error {
		t.Helper()
		conn, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		buf, _ := appendFrame(append([]byte(nil), preamble...), &raftpb.Message{Type: raftpb.MsgHeartbeat, From: 2, To: 1, Term: 9})
		if _, err := conn.Write(buf); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		return readRejection(conn)
	}
	oldMagic := []byte{'L', 'D', 'R', 'A', 'F', 'T', 0, 1}
	for _, tc := range []struct {
		name     string
		preamble []byte
		want     []string
	}{
		{"older build, no id", oldMagic, []string{"no cluster id", testCluster.String()}},
		{"zero id", append(raftStreamMagic[:], make([]byte, 16)...), []string{"no cluster id"}},
		{"other cluster", append(raftStreamMagic[:], otherCluster[:]...), []string{"peer is in cluster " + otherCluster.String(), "this server is in cluster " + testCluster.String()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := send(tc.preamble)
			if !errors.Is(err, errStreamRefused) {
				t.Fatalf("err = %v, want a refusal", err)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("err = %v, want it to name %q", err, s)
				}
			}
		})
	}
	if n := p.steps.Load(); n != 0 {
		t.Fatalf("%d refused messages reached Raft", n)
	}
	// The same message with this cluster's id goes through.
	conn, err := dialRaftStream(context.Background(), p.addr, testCluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf, _ := appendFrame(nil, &raftpb.Message{Type: raftpb.MsgHeartbeat, From: 2, To: 1, Term: 9})
	conn.Write(buf)
	deadline := time.Now().Add(5 * time.Second)
	for p.steps.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if p.steps.Load() != 1 {
		t.Fatal("a message of this cluster did not reach Raft")
	}
}

// stateOf is an encoded store snapshot at index of cluster id.
func stateOf(t *testing.T, id clusterid.ID, index uint64) []byte {
	t.Helper()
	s := store.New()
	s.SetClusterID(id)
	s.Advance(index)
	var b bytes.Buffer
	if _, err := s.Snapshot().WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// snapStream is one scripted snapshot stream: what its chunks say.
type snapStream struct {
	mdID, hdrID clusterid.ID
	size        uint64 // announced; 0: len(data)
	data        []byte
	chunk       int  // data per chunk; 0: 1 MiB
	noLast      bool // end the stream without the last chunk
	badSum      bool
	index       uint64
}

func (s snapStream) send(ctx context.Context, c lodestonepb.PeerClient) error {
	if !s.mdID.IsZero() {
		ctx = withID(ctx, s.mdID)
	}
	st, err := c.Snapshot(ctx)
	if err != nil {
		return err
	}
	m := raftpb.Message{Type: raftpb.MsgSnap, From: 2, To: 1, Term: 3,
		Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: s.index, Term: 3, ConfState: raftpb.ConfState{Voters: []uint64{1, 2}}}}}
	hb, _ := m.Marshal()
	size := s.size
	if size == 0 {
		size = uint64(len(s.data))
	}
	if err := st.Send(&lodestonepb.SnapshotChunk{Message: hb, ClusterId: clusterBytes(s.hdrID), Size: size}); err != nil {
		return err
	}
	chunk := s.chunk
	if chunk == 0 {
		chunk = snapshotChunkSize
	}
	for off := 0; off < len(s.data); off += chunk {
		if err := st.Send(&lodestonepb.SnapshotChunk{Data: s.data[off:min(off+chunk, len(s.data))]}); err != nil {
			break // NB: the receiver refused; CloseAndRecv says why
		}
	}
	if !s.noLast {
		sum := sha256.Sum256(s.data)
		crc := crc32.Checksum(s.data, castagnoli)
		if s.badSum {
			sum[0] ^= 1
		}
		st.Send(&lodestonepb.SnapshotChunk{Last: true, Sha256: sum[:], Crc32C: crc})
	}
	_, err = st.CloseAndRecv()
	return err
}

func TestSnapshotStreamChecked(t *testing.T) {
	const limit = 64 << 10
	p := newIdentityPort(t, Config{MaxSnapshotBytes: limit, MaxSnapshotChunks: 8})
	c := p.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	good := stateOf(t, testCluster, 5)
	corrupt := bytes.Clone(good)
	corrupt[len(corrupt)/2] ^= 0xff
	for _, tc := range []struct {
		name   string
		s      snapStream
		code   codes.Code
		reason string
		want   []string
	}{
		{"forged, no id", snapStream{data: good, index: 5}, codes.PermissionDenied, refusedNoCluster, []string{"no cluster id"}},
		{"metadata and header disagree", snapStream{mdID: testCluster, hdrID: otherCluster, data: good, index: 5}, codes.PermissionDenied, refusedNoCluster, []string{otherCluster.String(), testCluster.String()}},
		{"another cluster", snapStream{mdID: otherCluster, hdrID: otherCluster, data: stateOf(t, otherCluster, 5), index: 5}, codes.PermissionDenied, refusedCluster,
			[]string{"peer is in cluster " + otherCluster.String(), "this server is in cluster " + testCluster.String()}},
		{"announced oversize", snapStream{mdID: testCluster, hdrID: testCluster, size: limit + 1, data: good, index: 5}, codes.ResourceExhausted, refusedSnapOversize, []string{"over this server's limit of 65536"}},
		{"more than announced", snapStream{mdID: testCluster, hdrID: testCluster, size: 10, data: good, index: 5}, codes.InvalidArgument, refusedSnapOversize, []string{"more data than the 10 bytes announced"}},
		{"too many chunks", snapStream{mdID: testCluster, hdrID: testCluster, data: good, chunk: 8, index: 5}, codes.ResourceExhausted, refusedSnapChunks, []string{"more than 8 chunks"}},
		{"truncated, stream ends", snapStream{mdID: testCluster, hdrID: testCluster, data: good, noLast: true, index: 5}, codes.InvalidArgument, refusedSnapTruncated, []string{"truncated"}},
		{"truncated, short data", snapStream{mdID: testCluster, hdrID: testCluster, size: uint64(len(good)) + 1, data: good, index: 5}, codes.InvalidArgument, refusedSnapTruncated, []string{"truncated"}},
		{"bad checksum", snapStream{mdID: testCluster, hdrID: testCluster, data: good, badSum: true, index: 5}, codes.InvalidArgument, refusedSnapChecksum, []string{"checksum mismatch"}},
		{"sums fine, state corrupt", snapStream{mdID: testCluster, hdrID: testCluster, data: corrupt, index: 5}, codes.InvalidArgument, refusedSnapCorrupt, []string{"does not decode"}},
		{"state of another cluster", snapStream{mdID: testCluster, hdrID: testCluster, data: stateOf(t, otherCluster, 5), index: 5}, codes.PermissionDenied, refusedSnapForeign,
			[]string{"holds the state of cluster " + otherCluster.String()}},
		{"state of no cluster", snapStream{mdID: testCluster, hdrID: testCluster, data: stateOf(t, clusterid.ID{}, 5), index: 5}, codes.PermissionDenied, refusedSnapForeign, []string{"cluster none"}},
		{"index disagrees", snapStream{mdID: testCluster, hdrID: testCluster, data: good, index: 6}, codes.InvalidArgument, refusedSnapCorrupt, []string{"index 6, its state at index 5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := p.refused(t, tc.reason)
			err := tc.s.send(ctx, c)
			wantRefusal(t, err, tc.code, tc.want...)
			if got := p.refused(t, tc.reason); got != before+1 {
				t.Errorf("refused{reason=%q} went from %v to %v, want one more", tc.reason, before, got)
			}
		})
	}
	if n := p.steps.Load(); n != 0 {
		t.Fatalf("%d refused snapshots reached Raft", n)
	}
	if err := (snapStream{mdID: testCluster, hdrID: testCluster, data: good, chunk: 4096, index: 5}).send(ctx, c); err != nil {
		t.Fatalf("a good snapshot: %v", err)
	}
	if n := p.steps.Load(); n != 1 {
		t.Fatalf("a good snapshot reached Raft %d times, want 1", n)
	}
}

// A joining member learns its id from the first stream of a member it
// was told of, keeps it (OnLearn), and refuses other clusters from then on.
func TestJoiningMemberLearnsCluster(t *testing.T) {
	var learned atomic.Pointer[clusterid.ID]
	p := newIdentityPort(t, Config{OnLearn: func(id clusterid.ID) error { learned.Store(&id); return nil }})
	if !p.t.Cluster().IsZero() {
		t.Fatal("a joining member starts with an id")
	}
	stream := func(id clusterid.ID, from uint64) error {
		conn, err := dialRaftStream(context.Background(), p.addr, id, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		buf, _ := appendFrame(nil, &raftpb.Message{Type: raftpb.MsgHeartbeat, From: from, To: 1, Term: 2})
		conn.Write(buf)
		conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		return readRejection(conn)
	}
	// Not from a member it was told of: not learned.
	if err := stream(otherCluster, 9); !errors.Is(err, errStreamRefused) {
		t.Fatalf("stream from an unknown member: %v, want refused", err)
	}
	if err := p.t.SetPeer(2, "127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	if err := stream(testCluster, 2); errors.Is(err, errStreamRefused) {
		t.Fatalf("stream from a known member: %v", err)
	}
	if p.t.Cluster() != testCluster || learned.Load() == nil || *learned.Load() != testCluster {
		t.Fatalf("learned %s (OnLearn %v), want %s", p.t.Cluster(), learned.Load(), testCluster)
	}
	err := stream(otherCluster, 2)
	if !errors.Is(err, errStreamRefused) || !strings.Contains(err.Error(), otherCluster.String()) {
		t.Fatalf("another cluster after learning: %v", err)
	}
}

func FuzzRaftStreamPreamble(f *testing.F) {
	f.Add([]byte{1})
	f.Add(append([]byte{raftStreamVersion}, testCluster[:]...))
	f.Add([]byte{raftStreamVersion, 1, 2})
	f.Add([]byte{7})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := readPreambleRest(bytes.NewReader(b))
		if err != nil {
			return
		}
		switch b[0] {
		case 1:
			if !id.IsZero() {
				t.Fatalf("version 1 yielded id %s", id)
			}
		case raftStreamVersion:
			if !bytes.Equal(id[:], b[1:17]) {
				t.Fatalf("id %s, sent %x", id, b[1:17])
			}
		default:
			t.Fatalf("version %d accepted", b[0])
		}
	})
}
