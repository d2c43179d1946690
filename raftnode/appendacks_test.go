package raftnode

import (
	"slices"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// ackLog records what an appendAcks observed, in order.
type ackLog struct {
	peers []uint64
	lags  []time.Duration
}

func (l *ackLog) observe(peer uint64, d time.Duration) {
	l.peers = append(l.peers, peer)
	l.lags = append(l.lags, d)
}

func app(to, first, last uint64) raftpb.Message {
	m := raftpb.Message{Type: raftpb.MsgApp, To: to}
	for i := first; i <= last; i++ {
		m.Entries = append(m.Entries, raftpb.Entry{Index: i})
	}
	return m
}

func appResp(from, index uint64, reject bool) raftpb.Message {
	return raftpb.Message{Type: raftpb.MsgAppResp, From: from, Index: index, Reject: reject}
}

func TestAppendAcksTimesEachAppendToTheAckThatCoversIt(t *testing.T) {
	var l ackLog
	a := newAppendAcks(l.observe)
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

	a.sent(app(2, 1, 3), ms(0))
	a.sent(app(3, 1, 3), ms(0))
	a.sent(app(2, 4, 4), ms(5))
	a.sent(raftpb.Message{Type: raftpb.MsgApp, To: 2, Index: 4}, ms(6)) // commit notice: no entries, not timed
	a.sent(raftpb.Message{Type: raftpb.MsgHeartbeat, To: 2}, ms(6))

	// Peer 2 acknowledges through 4 at once: both its appends are timed.
	a.received(appResp(2, 4, false), ms(9))
	// Peer 3 rejects (as it would an append after index 3 it lacks), then
	// the leader resends 1..3 later: the first send's time stands, so the
	// retry shows in the lag.
	a.received(appResp(3, 3, true), ms(10))
	a.sent(app(3, 1, 3), ms(11))
	a.received(appResp(3, 3, false), ms(20))
	// An acknowledgement with nothing in flight times nothing.
	a.received(appResp(3, 3, false), ms(21))

	wantPeers := []uint64{2, 2, 3}
	wantLags := []time.Duration{9 * time.Millisecond, 4 * time.Millisecond, 20 * time.Millisecond}
	if !slices.Equal(l.peers, wantPeers) || !slices.Equal(l.lags, wantLags) {
		t.Fatalf("observed peers %v lags %v; want %v %v", l.peers, l.lags, wantPeers, wantLags)
	}
}

func TestAppendAcksBoundsEachPeerAndForgets(t *testing.T) {
	var l ackLog
	a := newAppendAcks(l.observe)
	t0 := time.Unix(1000, 0)
	for i := range uint64(maxSentAppends + 10) {
		a.sent(app(2, i+1, i+1), t0.Add(time.Duration(i)*time.Millisecond))
	}
	if got := len(a.pending[2]); got > maxSentAppends {
		t.Fatalf("%d appends in flight to a silent peer; want at most the bound, %d", got, maxSentAppends)
	}
	// The older half was dropped when the bound was reached: the first
	// append still timed is the one after it.
	kept := uint64(maxSentAppends/2 + 1)
	a.received(appResp(2, kept, false), t0.Add(time.Hour))
	if want := time.Hour - time.Duration(kept-1)*time.Millisecond; len(l.lags) != 1 || l.lags[0] != want {
		t.Fatalf("after dropping the older half, observed %v; want one lag of %v", l.lags, want)
	}

	a.sent(app(3, 1, 1), t0)
	a.forget(2)
	a.received(appResp(2, 100, false), t0.Add(time.Second))
	a.reset()
	a.received(appResp(3, 1, false), t0.Add(time.Second))
	if len(l.lags) != 1 {
		t.Fatalf("acknowledgements after forget and reset were timed: %v", l.lags)
	}
}
