package server

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// ents makes entries from..to of term, normal unless listed in conf.
func ents(term, from, to uint64, conf ...uint64) []raftpb.Entry {
	var out []raftpb.Entry
	for i := from; i <= to; i++ {
		e := raftpb.Entry{Term: term, Index: i, Type: raftpb.EntryNormal}
		if slices.Contains(conf, i) {
			e.Type = raftpb.EntryConfChangeV2
		}
		out = append(out, e)
	}
	return out
}

func appendMsg(commit uint64, es []raftpb.Entry) raftpb.Message {
	return raftpb.Message{Type: raftpb.MsgStorageAppend, Commit: commit, Entries: es}
}

// indexes renders entries as index/term pairs.
func indexes(es []raftpb.Entry) [][2]uint64 {
	var out [][2]uint64
	for _, e := range es {
		out = append(out, [2]uint64{e.Index, e.Term})
	}
	return out
}

func TestPendingEntries(t *testing.T) {
	type step struct {
		m       *raftpb.Message // recorded first, if set
		applied uint64
		limit   uint64
		want    [][2]uint64 // committed(applied, limit)
	}
	msg := func(m raftpb.Message) *raftpb.Message { return &m }
	snap := raftpb.Message{Type: raftpb.MsgStorageAppend, Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 20, Term: 3}}}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"nothing committed yet", []step{
			{m: msg(appendMsg(0, ents(1, 1, 3))), applied: 0, limit: 100, want: nil},
		}},
		{"commit arrives in a later hard state", []step{
			{m: msg(appendMsg(0, ents(1, 1, 3))), applied: 0, limit: 100, want: nil},
			{m: msg(appendMsg(2, nil)), applied: 0, limit: 100, want: [][2]uint64{{1, 1}, {2, 1}}},
		}},
		{"an append without a hard state does not lower the commit index", []step{
			{m: msg(appendMsg(3, ents(1, 1, 3))), applied: 0, limit: 100, want: [][2]uint64{{1, 1}, {2, 1}, {3, 1}}},
			{m: msg(appendMsg(0, ents(1, 4, 4))), applied: 1, limit: 100, want: [][2]uint64{{2, 1}, {3, 1}}},
		}},
		{"the limit holds entries back", []step{
			{m: msg(appendMsg(5, ents(1, 1, 5))), applied: 0, limit: 2, want: [][2]uint64{{1, 1}, {2, 1}}},
			{applied: 2, limit: 2, want: nil},
		}},
		{"a conf change waits for raft", []step{
			{m: msg(appendMsg(5, ents(1, 1, 5, 3))), applied: 0, limit: 100, want: [][2]uint64{{1, 1}, {2, 1}}},
			{applied: 2, limit: 100, want: nil},
			{applied: 3, limit: 100, want: [][2]uint64{{4, 1}, {5, 1}}},
		}},
		{"a gap after applied waits for raft", []step{
			{m: msg(appendMsg(9, ents(1, 5, 9))), applied: 2, limit: 100, want: nil},
			{applied: 4, limit: 100, want: [][2]uint64{{5, 1}, {6, 1}, {7, 1}, {8, 1}, {9, 1}}},
		}},
		{"a new leader's entries replace an uncommitted tail", []step{
			{m: msg(appendMsg(2, ents(1, 1, 5))), applied: 0, limit: 100, want: [][2]uint64{{1, 1}, {2, 1}}},
			{m: msg(appendMsg(4, ents(2, 3, 4))), applied: 2, limit: 100, want: [][2]uint64{{3, 2}, {4, 2}}},
			{m: msg(appendMsg(5, ents(2, 5, 5))), applied: 4, limit: 100, want: [][2]uint64{{5, 2}}},
		}},
		{"an append from before what is kept replaces all of it", []step{
			{m: msg(appendMsg(0, ents(1, 3, 5))), applied: 2, limit: 100, want: nil},
			{m: msg(appendMsg(4, ents(2, 3, 4))), applied: 2, limit: 100, want: [][2]uint64{{3, 2}, {4, 2}}},
		}},
		{"an append after a gap starts over", []step{
			{m: msg(appendMsg(0, ents(1, 1, 2))), applied: 0, limit: 100, want: nil},
			{m: msg(appendMsg(6, ents(1, 5, 6))), applied: 0, limit: 100, want: nil},
			{applied: 4, limit: 100, want: [][2]uint64{{5, 1}, {6, 1}}},
		}},
		{"a snapshot drops everything kept", []step{
			{m: msg(appendMsg(0, ents(1, 1, 30))), applied: 0, limit: 100, want: nil},
			{m: &snap, applied: 0, limit: 100, want: nil},
			{m: msg(appendMsg(22, ents(3, 21, 22))), applied: 20, limit: 100, want: [][2]uint64{{21, 3}, {22, 3}}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p pendingEntries
			for i, s := range tc.steps {
				if s.m != nil {
					p.record(*s.m)
				}
				p.release(s.applied)
				if got := indexes(p.committed(s.applied, s.limit)); !slices.Equal(got, s.want) {
					t.Fatalf("step %d: committed(%d, %d) = %v, want %v", i, s.applied, s.limit, got, s.want)
				}
			}
		})
	}
}

// release keeps what is not applied and lets go of the rest, reusing the
// backing array once everything is applied.
func TestPendingEntriesRelease(t *testing.T) {
	var p pendingEntries
	p.record(appendMsg(0, ents(1, 1, 10)))
	p.release(4)
	if got := indexes(p.ents); len(got) != 6 || got[0][0] != 5 {
		t.Fatalf("after release(4): %v, want 5..10", got)
	}
	p.release(10)
	if len(p.ents) != 0 || cap(p.ents) == 0 {
		t.Fatalf("after release(10): len %d cap %d, want empty with its array kept", len(p.ents), cap(p.ents))
	}
	full := p.ents[:cap(p.ents)]
	for i, e := range full {
		if e.Index != 0 {
			t.Fatalf("released slot %d still holds entry %d", i, e.Index)
		}
	}
}

// A member whose log writes are slow still applies, and delivers watch
// events for, what the other two made durable, long before its own write
// finishes; a leader whose log writes are slow answers writes the two
// followers committed. Each member's injected disk delay is far longer than
// the time allowed for the answer, so the assertions fail if applying waits
// for the local fsync, as it did.
func TestAppliesBeforeLocalFsync(t *testing.T) {
	const delay = 2 * time.Second
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.SlowLeader = SlowLeaderConfig{} })
	faults := map[string]*Faults{}
	for _, n := range c.names {
		faults[n] = &Faults{}
		c.startFaulty(n, faults[n])
	}
	lead := c.waitLeader()
	slow := c.follower()
	kv := c.kv(lead)
	put(t, kv, "warm", "up")

	w := openWatch(t, c, slow)
	w.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("k")})
	faults[slow].SetDiskDelay(delay)
	start := time.Now()
	resp := put(t, kv, "k", "v1")
	evs, _ := w.collect(1)
	if took := time.Since(start); took > delay/2 {
		t.Fatalf("the watch on %s (log writes take %v) got the write after %v", slow, delay, took)
	}
	if string(evs[0].Kv.GetValue()) != "v1" || evs[0].Kv.GetModifyIndex() != resp.Header.GetIndex() {
		t.Fatalf("watch event %+v, want k=v1 at index %d", evs[0].Kv, resp.Header.GetIndex())
	}
	if n := gauge(t, c.servers[slow], "lodestone_raft_entries_applied_before_local_fsync_total"); n < 1 {
		t.Errorf("%s: lodestone_raft_entries_applied_before_local_fsync_total = %v, want >= 1", slow, n)
	}
	faults[slow].SetDiskDelay(0)
	// NB: the slow write still sleeps; until it is done the follower
	// acknowledges nothing, and a leader without it has no quorum to
	// commit by.
	waitFor(t, 2*delay, func() bool {
		var m dto.Metric
		return c.servers[slow].node.slow.saveTime.Write(&m) == nil && m.GetHistogram().GetSampleSum() >= delay.Seconds()
	})

	faults[lead].SetDiskDelay(delay)
	ctx, cancel := context.WithTimeout(context.Background(), delay/2)
	defer cancel()
	start = time.Now()
	written, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte("k"), Value: []byte("v2")})
	if err != nil {
		t.Fatalf("put on the leader %s (log writes take %v): %v after %v", lead, delay, err, time.Since(start))
	}
	if n := gauge(t, c.servers[lead], "lodestone_raft_entries_applied_before_local_fsync_total"); n < 1 {
		t.Errorf("%s: lodestone_raft_entries_applied_before_local_fsync_total = %v, want >= 1", lead, n)
	}
	// An operator's snapshot of the leader covers the write its log does
	// not hold yet, with that entry's term.
	st, err := c.cluster(lead).Status(ctx, &lodestonepb.StatusRequest{})
	if err != nil {
		t.Fatalf("status of %s: %v", lead, err)
	}
	snaps, err := lodestonepb.NewAdminClient(c.conn(lead)).SaveSnapshot(ctx, &lodestonepb.SaveSnapshotRequest{})
	if err != nil {
		t.Fatalf("save snapshot on %s: %v", lead, err)
	}
	chunk, err := snaps.Recv()
	if err != nil {
		t.Fatalf("save snapshot on %s (log writes take %v): %v", lead, delay, err)
	}
	if h := chunk.GetHeader(); h.GetIndex() < written.Header.GetIndex() || h.GetTerm() != st.Term {
		t.Fatalf("snapshot header %+v, want index >= %d in term %d", h, written.Header.GetIndex(), st.Term)
	}
	for {
		if _, err := snaps.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("save snapshot on %s: %v", lead, err)
		}
	}
	faults[lead].SetDiskDelay(0)
	// Every member holds both writes once the delayed writes are done: the
	// early apply was not instead of the durable one.
	if got := get(t, c.kv(slow), "k", lodestonepb.Consistency_LINEARIZABLE); string(got.GetValue()) != "v2" {
		t.Fatalf("linearizable read on %s: %q, want v2", slow, got.GetValue())
	}
}
