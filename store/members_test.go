package store

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// The server's membership bookkeeping before the store owned it
// (server/node.go applyMemberAttrs and applyConfChange), written with the
// store's public methods: the reference the store's own apply must match.

func refMemberAttrs(s *Store, index uint64, mem *lodestonepb.Member) {
	for _, cur := range s.Members() {
		if cur.Id == mem.Id {
			upd := proto.CloneOf(cur)
			upd.GrpcAddr, upd.HttpAddr = mem.GrpcAddr, mem.HttpAddr
			s.SetMember(index, upd)
			return
		}
	}
	s.Advance(index)
}

func refConfChange(s *Store, index uint64, changes []raftpb.ConfChangeSingle, ctx *lodestonepb.Member) {
	members := map[uint64]*lodestonepb.Member{}
	for _, m := range s.Members() {
		members[m.Id] = m
	}
	for _, ch := range changes {
		switch ch.Type {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			m := members[ch.NodeID]
			if ctx != nil && ctx.Id == ch.NodeID {
				m = proto.CloneOf(ctx)
			} else if m != nil {
				m = proto.CloneOf(m)
			} else {
				m = &lodestonepb.Member{Id: ch.NodeID, Name: fmt.Sprintf("%x", ch.NodeID)}
			}
			m.Learner = ch.Type == raftpb.ConfChangeAddLearnerNode
			s.SetMember(index, m)
		case raftpb.ConfChangeRemoveNode:
			s.RemoveMember(index, ch.NodeID)
		}
	}
	s.Advance(index)
}

func cc(typ raftpb.ConfChangeType, id uint64) raftpb.ConfChangeSingle {
	return raftpb.ConfChangeSingle{Type: typ, NodeID: id}
}

const (
	addVoter   = raftpb.ConfChangeAddNode
	addLearner = raftpb.ConfChangeAddLearnerNode
	removeNode = raftpb.ConfChangeRemoveNode
	updateNode = raftpb.ConfChangeUpdateNode
)

func TestApplyMemberCommand(t *testing.T) {
	d := newDriver(t)
	d.s.ApplyConfChange(1, []raftpb.ConfChangeSingle{cc(addVoter, 1)},
		&lodestonepb.Member{Id: 1, Name: "n1", PeerAddr: "10.0.0.1:7401"})

	cmd := memberCmd(1, "10.0.0.1:7400", "10.0.0.1:8500")
	res, evs := d.apply(cmd)
	if res == nil || res.Result != nil || res.Rejected != nil || CheckCommand(cmd) != nil {
		t.Fatalf("member result %v (CheckCommand %v), want an empty result for a well-formed command", res, CheckCommand(cmd))
	}
	if len(evs) != 0 {
		t.Errorf("member command emitted events %q", fmtEvents(evs))
	}
	// Only the client addresses change: name, peer address and voting
	// rights are the conf changes' (the command says learner, name
	// "ignored").
	want := "index=2 kvindex=0 membersindex=2\nmember 1 n1 10.0.0.1:7401 10.0.0.1:7400 10.0.0.1:8500 learner=false\n"
	if got := dump(d.s); got != want {
		t.Errorf("after member command:\n%s\nwant\n%s", got, want)
	}

	// An unknown member (removed meanwhile, or never added): only the
	// index moves.
	d.apply(memberCmd(9, "x:1", "x:2"))
	want = "index=3 kvindex=0 membersindex=2\nmember 1 n1 10.0.0.1:7401 10.0.0.1:7400 10.0.0.1:8500 learner=false\n"
	if got := dump(d.s); got != want {
		t.Errorf("after unknown member:\n%s\nwant\n%s", got, want)
	}

	// Malformed: no member.
	bad := &lodestonepb.Command{Op: &lodestonepb.Command_Member{}}
	if err := CheckCommand(bad); err == nil {
		t.Errorf("CheckCommand accepted a member command without member")
	}
	d.apply(bad)
	if got, want := d.s.MembersIndex(), uint64(2); got != want {
		t.Errorf("MembersIndex = %d, want %d", got, want)
	}

	// A replay changes nothing.
	if res, evs := d.s.Apply(2, memberCmd(1, "y:1", "y:2")); res != nil || evs != nil {
		t.Errorf("replay returned %v %v", res, evs)
	}
	if m := d.s.Members()[0]; m.GrpcAddr != "10.0.0.1:7400" {
		t.Errorf("replay changed the member: %v", m)
	}
}

func TestApplyConfChange(t *testing.T) {
	n1 := &lodestonepb.Member{Id: 1, Name: "n1", PeerAddr: "p1", GrpcAddr: "g1", HttpAddr: "h1"}
	n2 := &lodestonepb.Member{Id: 2, Name: "n2", PeerAddr: "p2"}
	tests := []struct {
		name    string
		changes []raftpb.ConfChangeSingle
		ctx     *lodestonepb.Member
		added   []string // "id name peer learner"
		removed []uint64
		members string // the member lines of dump after the change
		mindex  uint64 // MembersIndex after
	}{
		{name: "add with context member", changes: []raftpb.ConfChangeSingle{cc(addVoter, 3)},
			ctx:     &lodestonepb.Member{Id: 3, Name: "n3", PeerAddr: "p3", Learner: true},
			added:   []string{"3 n3 p3 false"},
			members: "member 1 n1 p1 g1 h1 learner=false\nmember 2 n2 p2   learner=true\nmember 3 n3 p3   learner=false\n", mindex: 5},
		{name: "add learner with context member", changes: []raftpb.ConfChangeSingle{cc(addLearner, 3)},
			ctx:     &lodestonepb.Member{Id: 3, Name: "n3", PeerAddr: "p3"},
			added:   []string{"3 n3 p3 true"},
			members: "member 1 n1 p1 g1 h1 learner=false\nmember 2 n2 p2   learner=true\nmember 3 n3 p3   learner=true\n", mindex: 5},
		{name: "add without context is a placeholder named in hex", changes: []raftpb.ConfChangeSingle{cc(addVoter, 0xab)},
			added:   []string{"171 ab  false"},
			members: "member 1 n1 p1 g1 h1 learner=false\nmember 2 n2 p2   learner=true\nmember 171 ab    learner=false\n", mindex: 5},
		{name: "context member of another id is not used", changes: []raftpb.ConfChangeSingle{cc(addVoter, 4)},
			ctx:     &lodestonepb.Member{Id: 3, Name: "n3"},
			added:   []string{"4 4  false"},
			members: "member 1 n1 p1 g1 h1 learner=false\nmember 2 n2 p2   learner=true\nmember 4 4    learner=false\n", mindex: 5},
		{name: "promotion keeps the recorded member", changes: []raftpb.ConfChangeSingle{cc(addVoter, 2)},
			added:   []string{"2 n2 p2 false"},
			members: "member 1 n1 p1 g1 h1 learner=false\nmember 2 n2 p2   learner=false\n", mindex: 5},
		{name: "demotion keeps addresses", changes: []raftpb.ConfChangeSingle{cc(addLearner, 1)},
			added:   []string{"1 n1 p1 true"},
			members: "member 1 n1 p1 g1 h1 learner=true\nmember 2 n2 p2   learner=true\n", mindex: 5},
		{name: "context member replaces the recorded one", changes: []raftpb.ConfChangeSingle{cc(addVoter, 1)},
			ctx:     &lodestonepb.Member{Id: 1, Name: "n1", PeerAddr: "p1-new"},
			added:   []string{"1 n1 p1-new false"},
			members: "member 1 n1 p1-new   learner=false\nmember 2 n2 p2   learner=true\n", mindex: 5},
		{name: "remove", changes: []raftpb.ConfChangeSingle{cc(removeNode, 2)},
			removed: []uint64{2},
			members: "member 1 n1 p1 g1 h1 learner=false\n", mindex: 5},
		{name: "remove unknown still reports it", changes: []raftpb.ConfChangeSingle{cc(removeNode, 7)},
			removed: []uint64{7},
			members: "member 1 n1 p1 g1 h1 learner=false\nmember 2 n2 p2   learner=true\n", mindex: 2},
		{name: "update node changes nothing", changes: []raftpb.ConfChangeSingle{cc(updateNode, 1)},
			members: "member 1 n1 p1 g1 h1 learner=false\nmember 2 n2 p2   learner=true\n", mindex: 2},
		{name: "node id 0 is skipped", changes: []raftpb.ConfChangeSingle{cc(addVoter, 0), cc(removeNode, 0)},
			members: "member 1 n1 p1 g1 h1 learner=false\nmember 2 n2 p2   learner=true\n", mindex: 2},
		{name: "no changes", members: "member 1 n1 p1 g1 h1 learner=false\nmember 2 n2 p2   learner=true\n", mindex: 2},
		// Regression guard for the lookup rule: an add sees members as they
		// were before the entry, so a remove earlier in the same entry does
		// not turn it into a placeholder.
		// added and removed are the net effect per id, so the caller
		// cannot drop a peer the entry re-added.
		{name: "remove then add in one entry keeps the recorded member",
			changes: []raftpb.ConfChangeSingle{cc(removeNode, 2), cc(addVoter, 2)},
			added:   []string{"2 n2 p2 false"},
			members: "member 1 n1 p1 g1 h1 learner=false\nmember 2 n2 p2   learner=false\n", mindex: 5},
		{name: "add then remove in one entry",
			changes: []raftpb.ConfChangeSingle{cc(addVoter, 3), cc(removeNode, 3), cc(addLearner, 1)},
			added:   []string{"1 n1 p1 true"}, removed: []uint64{3},
			members: "member 1 n1 p1 g1 h1 learner=true\nmember 2 n2 p2   learner=true\n", mindex: 5},
		{name: "two adds of one id report the last",
			changes: []raftpb.ConfChangeSingle{cc(addLearner, 3), cc(addVoter, 3)},
			ctx:     &lodestonepb.Member{Id: 3, Name: "n3", PeerAddr: "p3"},
			added:   []string{"3 n3 p3 false"},
			members: "member 1 n1 p1 g1 h1 learner=false\nmember 2 n2 p2   learner=true\nmember 3 n3 p3   learner=false\n", mindex: 5},
		{name: "joint: add voter and learner, remove one",
			changes: []raftpb.ConfChangeSingle{cc(addVoter, 3), cc(addLearner, 4), cc(removeNode, 1)},
			ctx:     &lodestonepb.Member{Id: 4, Name: "n4", PeerAddr: "p4"},
			added:   []string{"3 3  false", "4 n4 p4 true"}, removed: []uint64{1},
			members: "member 2 n2 p2   learner=true\nmember 3 3    learner=false\nmember 4 n4 p4   learner=true\n", mindex: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setup := func() *Store {
				s := New()
				s.ApplyConfChange(1, []raftpb.ConfChangeSingle{cc(addVoter, 1)}, n1)
				s.ApplyConfChange(2, []raftpb.ConfChangeSingle{cc(addLearner, 2)}, n2)
				s.Apply(4, putCmd("k", "v"))
				return s
			}
			s, ref := setup(), setup()
			ctx := proto.CloneOf(tt.ctx)
			added, removed := s.ApplyConfChange(5, tt.changes, tt.ctx)
			var got []string
			for _, m := range added {
				got = append(got, fmt.Sprintf("%d %s %s %v", m.Id, m.Name, m.PeerAddr, m.Learner))
			}
			if !slices.Equal(got, tt.added) {
				t.Errorf("added = %q, want %q", got, tt.added)
			}
			if !slices.Equal(removed, tt.removed) {
				t.Errorf("removed = %v, want %v", removed, tt.removed)
			}
			wantDump := fmt.Sprintf("index=5 kvindex=4 membersindex=%d\nk=\"v\" c=4 m=4 l=0 f=0 s=\"\"\n%s", tt.mindex, tt.members)
			if got := dump(s); got != wantDump {
				t.Errorf("state:\n%s\nwant\n%s", got, wantDump)
			}
			if !proto.Equal(tt.ctx, ctx) {
				t.Errorf("ApplyConfChange modified the context member")
			}
			// The same answer two ways: the server's old bookkeeping.
			refConfChange(ref, 5, tt.changes, tt.ctx)
			if got, want := dump(s), dump(ref); got != want {
				t.Errorf("store and reference differ:\n%s\nreference\n%s", got, want)
			}
			checkInvariants(t, s)

			// Replays (below Index) change and return nothing; the same
			// index again is allowed, like SetMember, and changes nothing.
			before := dump(s)
			if a, r := s.ApplyConfChange(4, []raftpb.ConfChangeSingle{cc(removeNode, 1)}, nil); a != nil || r != nil {
				t.Errorf("replay returned %v %v", a, r)
			}
			s.ApplyConfChange(5, tt.changes, tt.ctx)
			if got := dump(s); got != before {
				t.Errorf("feeding the entry again changed the state:\n%s\nwant\n%s", got, before)
			}
		})
	}
}

// TestMembershipMatchesReference drives a store through random conf
// changes and member commands, and a second store through the server's
// old bookkeeping (refConfChange, refMemberAttrs): member tables and
// indices must agree after every entry.
func TestMembershipMatchesReference(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 7))
	s, ref := New(), New()
	peak := 0
	types := []raftpb.ConfChangeType{addVoter, addLearner, removeNode, updateNode}
	for index := uint64(1); index <= 2000; index++ {
		if r.IntN(3) == 0 {
			id := uint64(r.IntN(6))
			cmd := memberCmd(id, fmt.Sprint("g", index), fmt.Sprint("h", index))
			s.Apply(index, cmd)
			refMemberAttrs(ref, index, cmd.GetMember())
		} else {
			changes := make([]raftpb.ConfChangeSingle, r.IntN(4))
			for i := range changes {
				changes[i] = cc(types[r.IntN(len(types))], uint64(r.IntN(6)))
			}
			var ctx *lodestonepb.Member
			if r.IntN(2) == 0 {
				id := uint64(r.IntN(6))
				ctx = &lodestonepb.Member{Id: id, Name: fmt.Sprint("n", id), PeerAddr: fmt.Sprint("p", index), GrpcAddr: "g"}
			}
			added, removed := s.ApplyConfChange(index, changes, ctx)
			refConfChange(ref, index, changes, ctx)
			// Net effect: what is reported added is a member now, what is
			// reported removed is not, and no id is reported twice.
			seen := map[uint64]bool{}
			for _, m := range added {
				if seen[m.Id] || s.PeerAddr(m.Id) != m.PeerAddr || !slices.ContainsFunc(s.Members(), func(x *lodestonepb.Member) bool { return proto.Equal(x, m) }) {
					t.Fatalf("entry %d %v: added %v is reported twice or is not the stored member", index, changes, m)
				}
				seen[m.Id] = true
			}
			for _, id := range removed {
				if seen[id] || slices.ContainsFunc(s.Members(), func(x *lodestonepb.Member) bool { return x.Id == id }) {
					t.Fatalf("entry %d %v: removed %d is reported twice or still a member", index, changes, id)
				}
				seen[id] = true
			}
		}
		if got, want := dump(s), dump(ref); got != want {
			t.Fatalf("entry %d: store and reference differ:\n%s\nreference\n%s", index, got, want)
		}
		peak = max(peak, len(s.Members()))
	}
	// NB: the peak, not the members at the end: a random stream may end
	// just after removing the last of them (about one seed in 150).
	if peak < 3 {
		t.Errorf("stream too weak: at most %d members at once", peak)
	}
}

// A learner added to be promoted keeps AutoPromote; its promotion clears
// it, so a voter never reads as awaiting promotion.
func TestApplyConfChangeAutoPromote(t *testing.T) {
	s := New()
	m := &lodestonepb.Member{Id: 3, Name: "n3", PeerAddr: "p3", AutoPromote: true}
	s.ApplyConfChange(1, []raftpb.ConfChangeSingle{cc(addLearner, 3)}, m)
	if got := s.Members()[0]; !got.Learner || !got.AutoPromote {
		t.Fatalf("after add learner: %v, want a learner awaiting promotion", got)
	}
	s.ApplyConfChange(2, []raftpb.ConfChangeSingle{cc(addVoter, 3)}, s.Members()[0])
	if got := s.Members()[0]; got.Learner || got.AutoPromote {
		t.Fatalf("after promotion: %v, want a voter without auto_promote", got)
	}
}
