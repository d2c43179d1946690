package server

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/member"
)

// A write sent to a follower is forwarded to the leader, and a
// linearizable read on another member sees it (docs/architecture.md,
// invariant 4: "Reads are linearizable by default").
func TestWriteThroughFollowerReadOnAnother(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	followers := c.followersOf(lead)
	resp := put(t, c.kv(followers[0]), "greeting", "hello")
	if resp.Header.Index == 0 || resp.Kv.GetModifyIndex() != resp.Header.Index {
		t.Fatalf("put header index %d, kv modify index %d: want equal and non-zero", resp.Header.Index, resp.Kv.GetModifyIndex())
	}
	kv := get(t, c.kv(followers[1]), "greeting", lodestonepb.Consistency_LINEARIZABLE)
	if got, want := string(kv.GetValue()), "hello"; got != want {
		t.Fatalf("linearizable read on %s: got %q, want %q", followers[1], got, want)
	}
	if got, want := kv.ModifyIndex, resp.Header.Index; got != want {
		t.Fatalf("modify index: got %d, want %d", got, want)
	}
}

func TestKVOperationsOverGRPC(t *testing.T) {
	c := newTestCluster(t, 3)
	kv := c.kv(c.follower())
	ctx := ctxT(t)

	first := put(t, kv, "app/a", "1")
	put(t, kv, "app/b", "2")
	put(t, kv, "other", "x")

	// CAS on ModifyIndex: a stale index is refused and changes nothing.
	stale := first.Kv.ModifyIndex
	put(t, kv, "app/a", "1b")
	_, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte("app/a"), Value: []byte("lost"), Cas: &stale})
	if got := status.Code(err); got != codes.FailedPrecondition {
		t.Fatalf("stale cas: got %v (%v), want FailedPrecondition", got, err)
	}
	if got := string(get(t, kv, "app/a", lodestonepb.Consistency_LINEARIZABLE).Value); got != "1b" {
		t.Fatalf("after refused cas: got %q, want %q", got, "1b")
	}
	zero := uint64(0)
	if _, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte("app/a"), Value: []byte("x"), Cas: &zero}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("create-only on existing key: got %v, want FailedPrecondition", err)
	}
	if _, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte("app/new"), Value: []byte("x"), Cas: &zero}); err != nil {
		t.Fatalf("create-only on missing key: %v", err)
	}

	rng, err := kv.Range(ctx, &lodestonepb.RangeRequest{Prefix: []byte("app/"), Limit: 2})
	if err != nil {
		t.Fatalf("range: %v", err)
	}
	if got, want := keysOf(rng.Kvs), "app/a,app/b"; got != want || !rng.More {
		t.Fatalf("range limit 2: got %s more=%v, want %s more=true", got, rng.More, want)
	}

	// A transaction whose last check fails applies nothing.
	txn, err := kv.Txn(ctx, &lodestonepb.TxnRequest{Ops: []*lodestonepb.TxnOp{
		{Verb: lodestonepb.TxnOp_SET, Key: []byte("app/t1"), Value: []byte("v")},
		{Verb: lodestonepb.TxnOp_CHECK_NOT_EXISTS, Key: []byte("app/b")},
	}})
	if err != nil {
		t.Fatalf("txn: %v", err)
	}
	if txn.Succeeded || len(txn.Errors) != 1 || txn.Errors[0].OpIndex != 1 {
		t.Fatalf("txn with failing check: succeeded=%v errors=%v, want failure at op 1", txn.Succeeded, txn.Errors)
	}
	if kv := get(t, kv, "app/t1", lodestonepb.Consistency_LINEARIZABLE); kv != nil {
		t.Fatalf("txn rolled back but app/t1 exists: %v", kv)
	}

	del, err := kv.Delete(ctx, &lodestonepb.DeleteRequest{Key: []byte("app/"), Prefix: true})
	if err != nil {
		t.Fatalf("delete prefix: %v", err)
	}
	if got, want := del.Deleted, uint64(3); got != want {
		t.Fatalf("deleted: got %d, want %d", got, want)
	}
	if kv := get(t, kv, "other", lodestonepb.Consistency_STALE); kv == nil {
		t.Fatal("prefix delete removed a key outside the prefix")
	}
}

func keysOf(kvs []*lodestonepb.KeyValue) string {
	var keys []string
	for _, kv := range kvs {
		keys = append(keys, string(kv.Key))
	}
	return strings.Join(keys, ",")
}

// Bad input is refused with a message naming the rule, and changes nothing.
func TestBadInputRefused(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	kv := c.kv(lead)
	ctx := ctxT(t)
	before := c.servers[lead].store.KVIndex()

	cases := []struct {
		name string
		req  *lodestonepb.PutRequest
		want string
	}{
		{"empty key", &lodestonepb.PutRequest{Key: nil, Value: []byte("v")}, "empty"},
		{"NUL in key", &lodestonepb.PutRequest{Key: []byte("a\x00b"), Value: []byte("v")}, "NUL"},
		{"key too long", &lodestonepb.PutRequest{Key: bytes.Repeat([]byte("k"), c.base.Limits.MaxKeyBytes+1), Value: []byte("v")}, fmt.Sprint(c.base.Limits.MaxKeyBytes)},
		{"value too large", &lodestonepb.PutRequest{Key: []byte("k"), Value: make([]byte, c.base.Limits.MaxValueBytes+1)}, fmt.Sprint(c.base.Limits.MaxValueBytes)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := kv.Put(ctx, tc.req)
			if got := status.Code(err); got != codes.InvalidArgument {
				t.Fatalf("got %v (%v), want InvalidArgument", got, err)
			}
			if !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("message %q does not name the rule (want it to mention %q)", status.Convert(err).Message(), tc.want)
			}
		})
	}
	t.Run("transaction too large", func(t *testing.T) {
		ops := make([]*lodestonepb.TxnOp, c.base.Limits.MaxTxnOps+1)
		for i := range ops {
			ops[i] = &lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: []byte(fmt.Sprintf("k%d", i))}
		}
		_, err := kv.Txn(ctx, &lodestonepb.TxnRequest{Ops: ops})
		if got := status.Code(err); got != codes.InvalidArgument || !strings.Contains(err.Error(), fmt.Sprint(c.base.Limits.MaxTxnOps)) {
			t.Fatalf("got %v, want InvalidArgument naming %d", err, c.base.Limits.MaxTxnOps)
		}
	})
	t.Run("request over max-request-bytes", func(t *testing.T) {
		_, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte("k"), Value: make([]byte, c.base.MaxRequestBytes+1)})
		if got := status.Code(err); got != codes.ResourceExhausted {
			t.Fatalf("got %v (%v), want ResourceExhausted", got, err)
		}
	})
	t.Run("unknown member", func(t *testing.T) {
		_, err := c.cluster(lead).RemoveMember(ctx, &lodestonepb.RemoveMemberRequest{Member: &lodestonepb.MemberRef{Name: "nobody"}})
		if got := status.Code(err); got != codes.NotFound || !strings.Contains(err.Error(), "nobody") {
			t.Fatalf("got %v, want NotFound naming the member", err)
		}
	})
	if got := c.servers[lead].store.KVIndex(); got != before {
		t.Fatalf("refused requests changed the store index: %d -> %d", before, got)
	}
}

// Removing a voter is refused when the voters left reachable could not
// form a quorum.
func TestRemoveThatWouldLoseQuorumRefused(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	var down, other string
	for _, n := range c.names {
		if n != lead {
			if down == "" {
				down = n
			} else {
				other = n
			}
		}
	}
	c.stop(down)
	waitFor(t, 10*c.electionTimeout(), func() bool { return !c.servers[lead].raft.PeerActive(member.ID(down)) })
	_, err := c.cluster(lead).RemoveMember(ctxT(t), &lodestonepb.RemoveMemberRequest{Member: &lodestonepb.MemberRef{Name: other}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "quorum") {
		t.Fatalf("got %v, want FailedPrecondition about quorum", err)
	}
	members, err := c.cluster(lead).Members(ctxT(t), &lodestonepb.MembersRequest{})
	if err != nil {
		t.Fatalf("members: %v", err)
	}
	if got := len(members.Members); got != 3 {
		t.Fatalf("members after refused removal: got %d, want 3", got)
	}
}

// A stopped follower catches up by log after a restart.
func TestRestartCatchesUpByLog(t *testing.T) {
	c := newTestCluster(t, 3)
	f := c.follower()
	c.stop(f)
	lead := c.waitLeader()
	var last uint64
	for i := 0; i < 50; i++ {
		last = put(t, c.kv(lead), fmt.Sprintf("k%02d", i), fmt.Sprint(i)).Header.Index
	}
	c.start(f, false)
	c.waitApplied(f, last)
	for i := 0; i < 50; i += 7 {
		kv := get(t, c.kv(f), fmt.Sprintf("k%02d", i), lodestonepb.Consistency_STALE)
		if got, want := string(kv.GetValue()), fmt.Sprint(i); got != want {
			t.Fatalf("k%02d on restarted %s: got %q, want %q", i, f, got, want)
		}
	}
}

// A follower whose missing entries were truncated away catches up from a
// snapshot streamed by the leader, and restarts from its own snapshot.
func TestRestartCatchesUpBySnapshot(t *testing.T) {
	c := newTestCluster(t, 3, withSnapshotEvery(40, 5))
	f := c.follower()
	c.stop(f)
	lead := c.waitLeader()
	var last uint64
	for i := 0; i < 200; i++ {
		last = put(t, c.kv(lead), fmt.Sprintf("k%03d", i), fmt.Sprint(i)).Header.Index
	}
	if first := c.servers[lead].log.Stats().FirstIndex; first <= 2 {
		t.Fatalf("leader log first index %d: want it truncated by snapshots", first)
	}
	c.start(f, false)
	c.waitApplied(f, last)
	if got := c.servers[f].log.Stats().SnapshotIndex; got == 0 {
		t.Fatalf("%s caught up without a snapshot; the test meant to exercise snapshot install", f)
	}
	check := func(name string) {
		t.Helper()
		for i := 0; i < 200; i += 13 {
			kv := get(t, c.kv(name), fmt.Sprintf("k%03d", i), lodestonepb.Consistency_STALE)
			if got, want := string(kv.GetValue()), fmt.Sprint(i); got != want {
				t.Fatalf("k%03d on %s: got %q, want %q", i, name, got, want)
			}
		}
	}
	check(f)
	// And it restarts from its own snapshot plus log, leaving the
	// snapshot's values in its file rather than copying them.
	c.stop(f)
	c.start(f, false)
	c.waitApplied(f, last)
	check(f)
	if st := c.servers[f].store.ValueStats(); st.BaseFiles != 1 || st.BaseBytes == 0 {
		t.Errorf("%s restarted without reading its values from its snapshot file: %+v", f, st)
	}
}

func TestMembershipChangesOnLiveCluster(t *testing.T) {
	c := newTestCluster(t, 3)
	via := c.follower() // membership requests sent to a follower are forwarded

	// A fourth voter: it joins as a learner, the leader promotes it.
	addr := c.add("n4")
	var resp *lodestonepb.AddMemberResponse
	err := retryUnavailable(t, func(ctx context.Context) (err error) {
		resp, err = c.cluster(via).AddMember(ctx, &lodestonepb.AddMemberRequest{Name: "n4", PeerAddr: addr})
		return err
	})
	if err != nil {
		t.Fatalf("add n4: %v", err)
	}
	if got := len(resp.Members); got != 4 {
		t.Fatalf("members after add: got %d, want 4", got)
	}
	c.start("n4", true)
	last := put(t, c.kv(via), "after-n4", "x").Header.Index
	c.waitApplied("n4", last)
	waitFor(t, 20*c.electionTimeout(), func() bool { return !memberNamed(t, c, via, "n4").Learner })

	// A non-voter, then its promotion.
	c.addLearner(via, "n5")
	last = put(t, c.kv(via), "after-n5", "x").Header.Index
	c.waitApplied("n5", last)
	if got := get(t, c.kv("n5"), "after-n5", lodestonepb.Consistency_STALE); got == nil {
		t.Fatal("stale read on the learner misses a committed write it applied")
	}
	if m := memberNamed(t, c, via, "n5"); !m.Learner {
		t.Fatalf("n5 before promotion: learner=%v, want true", m.Learner)
	}
	promoteDeadline := time.Now().Add(5 * time.Second)
	for {
		err = retryUnavailable(t, func(ctx context.Context) error {
			_, err := c.cluster(via).PromoteMember(ctx, &lodestonepb.PromoteMemberRequest{Member: &lodestonepb.MemberRef{Name: "n5"}})
			return err
		})
		if err == nil || time.Now().After(promoteDeadline) || status.Code(err) != codes.FailedPrecondition {
			break
		}
		time.Sleep(c.base.TickInterval) // the leader learns the learner's progress on the next heartbeat
	}
	if err != nil {
		t.Fatalf("promote n5: %v", err)
	}
	if m := memberNamed(t, c, via, "n5"); m.Learner {
		t.Fatal("n5 is still a learner after promotion")
	}

	// Remove one of the original members; it stops itself.
	victim := "n1"
	if victim == via {
		victim = "n2"
	}
	removed := c.servers[victim].Done()
	var rm *lodestonepb.RemoveMemberResponse
	removeDeadline := time.Now().Add(5 * time.Second)
	for {
		err = retryUnavailable(t, func(ctx context.Context) (err error) {
			rm, err = c.cluster(via).RemoveMember(ctx, &lodestonepb.RemoveMemberRequest{Member: &lodestonepb.MemberRef{Name: victim}})
			return err
		})
		// NB: the quorum guard counts voters the leader heard from lately;
		// right after the promotion it may not have heard from n5 yet, and
		// refuses (nothing changes). It hears on the next heartbeat.
		if err == nil || time.Now().After(removeDeadline) || status.Code(err) != codes.FailedPrecondition ||
			!strings.Contains(err.Error(), "quorum would be lost") {
			break
		}
		time.Sleep(c.base.TickInterval)
	}
	if err != nil {
		t.Fatalf("remove %s: %v", victim, err)
	}
	if got := len(rm.Members); got != 4 {
		t.Fatalf("members after remove: got %d, want 4", got)
	}
	select {
	case err := <-removed:
		if err == nil || !strings.Contains(err.Error(), "removed") {
			t.Fatalf("removed member stopped with %v, want a removal reason", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not learn of its removal", victim)
	}
	c.stop(victim)
	// NB: the victim may have been the leader; a put racing the election
	// that follows is refused with Aborted (outcome unknown), correctly.
	c.waitLeader()
	put(t, c.kv(via), "after-remove", "x")
}

func memberNamed(t *testing.T, c *testCluster, via, name string) *lodestonepb.Member {
	t.Helper()
	resp, err := c.cluster(via).Members(ctxT(t), &lodestonepb.MembersRequest{})
	if err != nil {
		t.Fatalf("members: %v", err)
	}
	for _, m := range resp.Members {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("member %s not listed", name)
	return nil
}

func TestTransferLeader(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	target := c.follower()
	// Ask a member that is not the leader, naming the target.
	var via string
	for _, n := range c.names {
		if n != lead && n != target {
			via = n
		}
	}
	put(t, c.kv(lead), "before", "x")
	resp, err := c.cluster(via).TransferLeader(ctxT(t), &lodestonepb.TransferLeaderRequest{To: &lodestonepb.MemberRef{Name: target}})
	if err != nil {
		t.Fatalf("transfer to %s: %v", target, err)
	}
	if got, want := resp.LeaderId, c.servers[target].ID(); got != want {
		t.Fatalf("new leader id: got %x, want %x", got, want)
	}
	if got := c.waitLeader(); got != target {
		t.Fatalf("agreed leader after transfer: got %s, want %s", got, target)
	}
	// Without a target the leader picks a voter.
	resp, err = c.cluster(target).TransferLeader(ctxT(t), &lodestonepb.TransferLeaderRequest{})
	if err != nil {
		t.Fatalf("transfer without target: %v", err)
	}
	if resp.LeaderId == c.servers[target].ID() || resp.LeaderId == 0 {
		t.Fatalf("transfer without target left leadership on %x", resp.LeaderId)
	}
	put(t, c.kv(via), "after", "x")
}

// Status reports Raft and log state for operators.
func TestStatusAndHealth(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	written := put(t, c.kv(lead), "k", "v").GetHeader().GetIndex()
	st, err := c.cluster(lead).Status(ctxT(t), &lodestonepb.StatusRequest{})
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if st.RaftState != "StateLeader" || st.LeaderName != lead || st.Term == 0 || st.CommitIndex == 0 {
		t.Fatalf("status: state %s leader %q term %d commit %d", st.RaftState, st.LeaderName, st.Term, st.CommitIndex)
	}
	if st.Log.GetFileBytes() == 0 {
		t.Fatalf("log stats: %+v, want the log file's size", st.Log)
	}
	// An acknowledged write is in the logs of a quorum, not necessarily
	// the leader's: the leader commits on its followers' acknowledgements
	// and applies and answers without waiting for its own append
	// (earlyapply.go).
	var holding []string
	for _, name := range c.names {
		st, err := c.cluster(name).Status(ctxT(t), &lodestonepb.StatusRequest{})
		if err != nil {
			t.Fatalf("status of %s: %v", name, err)
		}
		if st.Log.GetLastIndex() >= written {
			holding = append(holding, name)
		}
	}
	if len(holding) < 2 {
		t.Fatalf("the acknowledged write at %d is in the logs of %v only, want a quorum of 3", written, holding)
	}
}

// Regression: followers numbered their read-index contexts alike, and the
// leader drops a read whose context it is already confirming, so
// concurrent linearizable reads from two followers timed out.
func TestConcurrentLinearizableReadsFromEveryMember(t *testing.T) {
	c := newTestCluster(t, 3)
	put(t, c.kv(c.waitLeader()), "k", "v")
	var wg sync.WaitGroup
	errs := make(chan error, 3*20)
	for _, n := range c.names {
		kv := c.kv(n)
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := kv.Get(ctxT(t), &lodestonepb.GetRequest{Key: []byte("k")}); err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("linearizable read: %v", err)
	}
}

// Regression: a member added after the newest snapshot, to a log already
// truncated by it, must catch up. The leader can only send it a snapshot,
// and a snapshot whose conf state predates the member is refused by the
// member's Raft ("not in the ConfState"), forever unless a newer snapshot
// is taken. Found by the chaos harness's member fault.
func TestMemberAddedAfterSnapshotCatchesUp(t *testing.T) {
	c := newTestCluster(t, 3, withSnapshotEvery(40, 5))
	lead := c.waitLeader()
	for i := 0; i < 100; i++ {
		put(t, c.kv(lead), fmt.Sprintf("k%03d", i), fmt.Sprint(i))
	}
	if first := c.servers[lead].log.Stats().FirstIndex; first <= 2 {
		t.Fatalf("leader log first index %d: want it truncated by snapshots", first)
	}
	c.addLearner(lead, "n4")
	last := put(t, c.kv(lead), "after-n4", "x").Header.Index
	c.waitApplied("n4", last)
	if got := get(t, c.kv("n4"), "k042", lodestonepb.Consistency_STALE); string(got.GetValue()) != "42" {
		t.Fatalf("k042 on n4: got %q, want %q", got.GetValue(), "42")
	}
}
