package peer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/prometheus/client_golang/prometheus"
)

func TestFramesRoundTrip(t *testing.T) {
	msgs := []raftpb.Message{
		{Type: raftpb.MsgApp, To: 2, From: 1, Term: 3, Index: 9, LogTerm: 3, Commit: 8,
			Entries: []raftpb.Entry{{Term: 3, Index: 10, Data: []byte("put a=1")}, {Term: 3, Index: 11, Data: bytes.Repeat([]byte{7}, 5000)}}},
		{Type: raftpb.MsgHeartbeat, To: 2, From: 1, Term: 3, Commit: 11},
		{Type: raftpb.MsgAppResp, To: 1, From: 2, Term: 3, Index: 11},
		// Over frameKeep: read into a buffer of its own.
		{Type: raftpb.MsgApp, To: 2, From: 1, Term: 3, Index: 11, LogTerm: 3, Commit: 11,
			Entries: []raftpb.Entry{{Term: 3, Index: 12, Data: bytes.Repeat([]byte{9}, frameKeep+1)}}},
		{Type: raftpb.MsgHeartbeat, To: 2, From: 1, Term: 3, Commit: 12},
	}
	var buf []byte
	for i := range msgs {
		var err error
		if buf, err = appendFrame(buf, &msgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	f := newFrameReader(bytes.NewReader(buf), 64)
	for i, want := range msgs {
		var got raftpb.Message
		if err := f.message(&got); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if got.String() != want.String() {
			t.Fatalf("message %d: got %v, want %v", i, got, want)
		}
	}
	var m raftpb.Message
	if err := f.message(&m); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: got %v, want EOF", err)
	}

	// A frame cut short is an error, never a message.
	f = newFrameReader(bytes.NewReader(buf[:len(buf)-3]), 64)
	for range len(msgs) - 1 {
		if err := f.message(&m); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.message(&m); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("torn frame: got %v, want an unexpected EOF", err)
	}
}

func TestFrameLengthChecked(t *testing.T) {
	for _, n := range []uint32{0, maxMsgBytes + 1, 1<<32 - 1} {
		frame := binary.BigEndian.AppendUint32(nil, n)
		_, err := newFrameReader(bytes.NewReader(frame), 64).next()
		if err == nil || !strings.Contains(err.Error(), "want 1 to") {
			t.Errorf("frame of %d bytes: got %v, want a length error", n, err)
		}
	}
	frame := binary.BigEndian.AppendUint32(nil, 3)
	frame = append(frame, 0xff, 0xff, 0xff)
	var m raftpb.Message
	if err := newFrameReader(bytes.NewReader(frame), 64).message(&m); err == nil || !strings.Contains(err.Error(), "decode raft message") {
		t.Errorf("garbage frame: got %v, want a decode error", err)
	}
}

// TestPeerPortServesBoth: one port serves Raft streams and the peer gRPC
// API, and a client that connects and says nothing holds up neither.
func TestPeerPortServesBoth(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan raftpb.Message, 16)
	rt := newTestTransport(1, testNode{step: func(ctx context.Context, m raftpb.Message) error {
		select {
		case got <- m:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}, nil)
	defer rt.Close()
	mux := newPeerMux(ln, slog.New(slog.DiscardHandler), rt.ReceiveStream)
	srv := grpc.NewServer()
	lodestonepb.RegisterPeerServer(srv, indexOnlyPeer{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(mux) }()
	defer func() {
		srv.Stop()
		if err := mux.Close(); err != nil {
			t.Errorf("close mux: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("grpc serve: %v", err)
		}
	}()

	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := lodestonepb.NewPeerClient(conn).LeaderIndex(ctx, &lodestonepb.LeaderIndexRequest{})
	if err != nil || resp.GetIndex() != 42 {
		t.Fatalf("gRPC call on the peer port: %v, %v", resp, err)
	}

	stream, err := dialRaftStream(ctx, ln.Addr().String(), testCluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var buf []byte
	for i := range 3 {
		m := raftpb.Message{Type: raftpb.MsgHeartbeat, To: 1, From: 2, Term: 1, Commit: uint64(i)}
		if buf, err = appendFrame(buf, &m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := stream.Write(buf); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		select {
		case m := <-got:
			if m.Commit != uint64(i) || m.From != 2 {
				t.Fatalf("message %d: got %v", i, m)
			}
		case <-ctx.Done():
			t.Fatalf("message %d not delivered", i)
		}
	}

	// Closing the port ends the Raft streams it serves.
	srv.Stop()
	if err := mux.Close(); err != nil {
		t.Fatalf("close mux: %v", err)
	}
	stream.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := stream.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read after close: got %v, want the stream ended", err)
	}
}

type indexOnlyPeer struct {
	lodestonepb.UnimplementedPeerServer
}

func (indexOnlyPeer) LeaderIndex(context.Context, *lodestonepb.LeaderIndexRequest) (*lodestonepb.LeaderIndexResponse, error) {
	return &lodestonepb.LeaderIndexResponse{Index: 42}, nil
}

// TestRemovedMemberIsTold: a member's messages to a peer that removed it
// end in a rejection, and the member learns from it that it was removed
// (it may never see its removal committed).
func TestRemovedMemberIsTold(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	rt := newTestTransport(1, testNode{step: func(context.Context, raftpb.Message) error {
		t.Error("a removed member's message reached Raft")
		return nil
	}}, nil)
	rt.RemovePeer(2)
	mux := newPeerMux(ln, logger, rt.ReceiveStream)
	defer func() {
		if err := mux.Close(); err != nil {
			t.Errorf("close mux: %v", err)
		}
		if err := rt.Close(); err != nil {
			t.Errorf("close transport: %v", err)
		}
	}()

	removed := make(chan struct{})
	sm := prometheus.NewRegistry()
	st := newTestTransport(2, testNode{removed: func() {
		select {
		case <-removed:
		default:
			close(removed)
		}
	}}, sm)
	defer st.Close()
	if err := st.SetPeer(1, ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	st.Send(raftpb.Message{Type: raftpb.MsgHeartbeatResp, To: 1, From: 2, Term: 1})
	select {
	case <-removed:
	case <-time.After(5 * time.Second):
		t.Fatal("the removed member was not told")
	}
	// The ended stream is counted once runPeer has it back.
	deadline := time.Now().Add(5 * time.Second)
	for gathered(t, sm, "lodestone_peer_stream_ends_total") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("lodestone_peer_stream_ends_total did not count the refused stream")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRaftStreamUserTimeout: a Raft stream carries TCP_USER_TIMEOUT, the
// option that fails a stream to a peer that stops acknowledging within
// seconds rather than TCP's minutes of retransmission.
func TestRaftStreamUserTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := dialRaftStream(context.Background(), ln.Addr().String(), testCluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got int
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if want := int(raftStreamUserTimeout.Milliseconds()); got != want {
		t.Fatalf("TCP_USER_TIMEOUT: got %d ms, want %d", got, want)
	}
}

// blockingIndexPeer answers LeaderIndex once release closes, after saying
// on entered that a call arrived.
type blockingIndexPeer struct {
	lodestonepb.UnimplementedPeerServer
	entered chan struct{}
	release chan struct{}
}

func (p blockingIndexPeer) LeaderIndex(ctx context.Context, _ *lodestonepb.LeaderIndexRequest) (*lodestonepb.LeaderIndexResponse, error) {
	p.entered <- struct{}{}
	select {
	case <-p.release:
		return &lodestonepb.LeaderIndexResponse{Index: 42}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestRemovedPeerAnswersCallsInFlight: a call in flight to a peer when it
// is removed still gets its answer (a follower that forwarded the
// removal of the leader applies it before the leader's answer arrives);
// the peer's connection closes once that call ended.
func TestRemovedPeerAnswersCallsInFlight(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	blocking := blockingIndexPeer{entered: make(chan struct{}, 1), release: make(chan struct{})}
	lodestonepb.RegisterPeerServer(srv, blocking)
	go srv.Serve(ln)
	defer srv.Stop()

	tr := newTestTransport(2, testNode{}, nil)
	defer tr.Close()
	if err := tr.SetPeer(1, ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	c, ok := tr.Client(1)
	if !ok {
		t.Fatal("no client for peer 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	answer := make(chan error, 1)
	go func() {
		resp, err := c.LeaderIndex(ctx, &lodestonepb.LeaderIndexRequest{})
		if err == nil && resp.Index != 42 {
			err = fmt.Errorf("index %d, want 42", resp.Index)
		}
		answer <- err
	}()
	<-blocking.entered
	tr.RemovePeer(1)
	close(blocking.release)
	if err := <-answer; err != nil {
		t.Fatalf("the call in flight when its peer was removed: %v, want its answer", err)
	}
	if _, err := c.LeaderIndex(ctx, &lodestonepb.LeaderIndexRequest{}); status.Code(err) != codes.Canceled {
		t.Fatalf("a call after the removed peer's last one ended: %v, want Canceled (connection closed)", err)
	}
}
