package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/member"
)

// promotedTotal is the leader's lodestone_members_promoted_total.
func promotedTotal(s *Server) float64 { return testutil.ToFloat64(s.metrics.promoted) }

// The scenario: a voter nobody answers must not cost a one-member
// cluster its quorum. With voter_now it is refused, naming the address;
// without, it joins as a learner that never catches up, is never
// promoted, and the cluster keeps taking writes.
func TestUnreachableMemberNeverBecomesVoter(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	dead := freeAddr(t) // NB: bound and released: nothing answers there

	_, err := c.cluster(lead).AddMember(ctxT(t), &lodestonepb.AddMemberRequest{Name: "evil", PeerAddr: dead, VoterNow: true})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), dead) || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("add unreachable voter now: %v, want FailedPrecondition naming %s", err, dead)
	}
	if got := len(memberList(t, c, lead)); got != 1 {
		t.Fatalf("members after refused add: %d, want 1", got)
	}
	_, err = c.cluster(lead).AddMember(ctxT(t), &lodestonepb.AddMemberRequest{Name: "evil", PeerAddr: dead, Learner: true, VoterNow: true})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("learner and voter_now: %v, want InvalidArgument", err)
	}

	var resp *lodestonepb.AddMemberResponse
	if err := retryUnavailable(t, func(ctx context.Context) (err error) {
		resp, err = c.cluster(lead).AddMember(ctx, &lodestonepb.AddMemberRequest{Name: "evil", PeerAddr: dead})
		return err
	}); err != nil {
		t.Fatalf("add unreachable member as learner: %v", err)
	}
	if m := resp.Member; !m.Learner || !m.AutoPromote {
		t.Fatalf("added %v, want a learner awaiting promotion", m)
	}
	// Writes over several election timeouts: each one the leader commits
	// alone, and the learner, never answering, is never promoted.
	deadline := time.Now().Add(5 * c.electionTimeout())
	for i := 0; time.Now().Before(deadline); i++ {
		put(t, c.kv(lead), "k", "v")
	}
	if m := memberNamed(t, c, lead, "evil"); !m.Learner {
		t.Fatalf("unreachable member became a voter: %v", m)
	}
	if got := promotedTotal(c.servers[lead]); got != 0 {
		t.Fatalf("promoted %v members, want 0", got)
	}
	put(t, c.kv(lead), "still", "writable")
}

// A real server joining a one-member cluster is added as a learner,
// catches up, and is promoted by the leader without anyone asking; two
// such members then carry the cluster when the first leader goes away.
func TestLearnerIsPromotedOnceCaughtUp(t *testing.T) {
	c := newTestCluster(t, 1)
	first := c.waitLeader()
	for i := 0; i < 50; i++ {
		put(t, c.kv(first), "k", "v")
	}
	for _, name := range []string{"n2", "n3"} {
		addr := c.add(name)
		var resp *lodestonepb.AddMemberResponse
		if err := retryUnavailable(t, func(ctx context.Context) (err error) {
			resp, err = c.cluster(first).AddMember(ctx, &lodestonepb.AddMemberRequest{Name: name, PeerAddr: addr})
			return err
		}); err != nil {
			t.Fatalf("add %s: %v", name, err)
		}
		if !resp.Member.Learner {
			t.Fatalf("%s added as %v, want a learner", name, resp.Member)
		}
		c.start(name, true)
		waitFor(t, 20*c.electionTimeout(), func() bool { return !memberNamed(t, c, first, name).Learner })
		if m := memberNamed(t, c, first, name); m.AutoPromote {
			t.Fatalf("promoted %s still awaits promotion: %v", name, m)
		}
	}
	if got := promotedTotal(c.servers[first]); got != 2 {
		t.Fatalf("lodestone_members_promoted_total = %v, want 2", got)
	}
	last := put(t, c.kv(first), "before-failover", "x").Header.Index
	c.waitApplied("n2", last)
	c.waitApplied("n3", last)
	// The promoted voters elect a leader of their own.
	c.stop(first)
	lead := c.waitLeader()
	if lead == first {
		t.Fatalf("leader is still %s", first)
	}
	put(t, c.kv(lead), "after-failover", "x")
}

// With a member down, the strict check refuses a change whose new
// configuration would have no quorum among the members reachable now:
// adding a voter (3 of 4 needed, 2 reachable) and removing a live one.
func TestStrictReconfigWithMemberDown(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	fs := c.followersOf(lead)
	down, other := fs[0], fs[1]
	c.stop(down)
	waitFor(t, 10*c.electionTimeout(), func() bool { return !c.servers[lead].raft.PeerActive(member.ID(down)) })

	// n4 runs, so the probe passes; the quorum check refuses.
	addr := c.add("n4")
	c.start("n4", true)
	_, err := c.cluster(lead).AddMember(ctxT(t), &lodestonepb.AddMemberRequest{Name: "n4", PeerAddr: addr, VoterNow: true})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "2 of the 4 voters of the new configuration reachable; it needs 3") {
		t.Fatalf("add voter with a member down: %v, want a refusal counting 2 of 4 reachable, 3 needed", err)
	}
	_, err = c.cluster(lead).RemoveMember(ctxT(t), &lodestonepb.RemoveMemberRequest{Member: &lodestonepb.MemberRef{Name: other}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "1 of the 2 voters of the new configuration reachable; it needs 2") {
		t.Fatalf("remove live voter with a member down: %v, want a refusal counting 1 of 2 reachable, 2 needed", err)
	}
	if got := len(memberList(t, c, lead)); got != 3 {
		t.Fatalf("members after refused changes: %d, want 3", got)
	}
	// Removing the member that is down leaves two reachable of two.
	if err := retryUnavailable(t, func(ctx context.Context) error {
		_, err := c.cluster(lead).RemoveMember(ctx, &lodestonepb.RemoveMemberRequest{Member: &lodestonepb.MemberRef{Name: down}})
		return err
	}); err != nil {
		t.Fatalf("remove the member that is down: %v", err)
	}
	put(t, c.kv(lead), "after", "x")
}

// Removing a voter that leaves a single one needs force.
func TestRemoveDownToOneVoterNeedsForce(t *testing.T) {
	c := newTestCluster(t, 2)
	lead := c.waitLeader()
	other := c.followersOf(lead)[0]
	_, err := c.cluster(lead).RemoveMember(ctxT(t), &lodestonepb.RemoveMemberRequest{Member: &lodestonepb.MemberRef{Name: other}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "only voter") || !strings.Contains(err.Error(), "force") {
		t.Fatalf("remove down to one voter: %v, want FailedPrecondition asking for force", err)
	}
	if got := len(memberList(t, c, lead)); got != 2 {
		t.Fatalf("members after refused removal: %d, want 2", got)
	}
	removed := c.servers[other].Done()
	if err := retryUnavailable(t, func(ctx context.Context) error {
		_, err := c.cluster(lead).RemoveMember(ctx, &lodestonepb.RemoveMemberRequest{Member: &lodestonepb.MemberRef{Name: other}, Force: true})
		return err
	}); err != nil {
		t.Fatalf("remove with force: %v", err)
	}
	select {
	case <-removed:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not learn of its removal", other)
	}
	c.stop(other)
	if got := len(memberList(t, c, lead)); got != 1 {
		t.Fatalf("members after forced removal: %d, want 1", got)
	}
	put(t, c.kv(lead), "alone", "x")
}

func memberList(t *testing.T, c *testCluster, via string) []*lodestonepb.Member {
	t.Helper()
	resp, err := c.cluster(via).Members(ctxT(t), &lodestonepb.MembersRequest{})
	if err != nil {
		t.Fatalf("members: %v", err)
	}
	return resp.Members
}
