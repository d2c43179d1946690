package store

import (
	"bytes"
	"errors"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// FuzzApply: no command content may panic Apply or break an invariant, a
// command ValidateCommand accepts is never reported malformed by Apply, and
// only an admission command changes the admission policy.
// The seed corpus runs with every `go test`; `go test -fuzz FuzzApply`
// explores further.
func FuzzApply(f *testing.F) {
	for _, c := range []*lodestonepb.Command{
		putCmd("a", "1"), putCAS("a", "2", 1), delPrefix("a"), delCAS("b", 0),
		txnCmd(opSet("a", "x"), op(GET, "a"), op(DELETE_PREFIX, "a"), opIdx(CHECK_INDEX, "b", 2)),
		txnCmd(op(lodestonepb.TxnOp_Verb(77), "a"), nil), {},
		at(t0, regSvc("n1", "web-2", "web")), at(t0, regCheck("n1", "c1", "web-1", CRITICAL)), at(t0, dereg("n1", "", "")),
		at(t0, checkUpd("n1", "c1", CRITICAL, "x")), at(t0, sessCreate(sid(2), "n1", withChecks("c1"))),
		at(t0, sessDestroy(sid(1))), at(t0, sessRenew(sid(1))), at(t0, sessInvalidate("n1", t0, sid(1))),
		at(t0, acquireCmd("a", "x", sid(1))), releaseCmd("b", "", sid(1)),
		at(t0, txnCmd(opLock(LOCK, "a", "v", sid(1)), opLock(UNLOCK, "b", "", sid(1)), opLock(CHECK_SESSION, "b", "", sid(1)))),
		memberCmd(1, "g", "h"), admissionCmd(policy(5, true)), admissionCmd(&lodestonepb.AdmissionPolicy{}),
		putCmd(legacyAdmissionKey, "x"), delPrefix("_lodestone"),
		bootstrapCmd("acc-2", "sec-2"), policySet(true, "p2", "p2", `key "a" { policy = "list" }`),
		policySet(false, "p1", "renamed", `service_prefix "" { policy = "read" }`), roleSet(true, "r2", "r2", byName("p1")),
		tokenSet(true, "a2", "s2", []*lodestonepb.ACLLink{byID("p1")}, []*lodestonepb.ACLLink{byName("r1")}),
		tokenSet(false, acl.AnonymousTokenID, "", []*lodestonepb.ACLLink{byName("p1")}, nil),
		aclCmd(&lodestonepb.ACLCommand{Op: &lodestonepb.ACLCommand_PolicyDelete{PolicyDelete: "p1"}}),
		aclCmd(&lodestonepb.ACLCommand{Op: &lodestonepb.ACLCommand_TokenDelete{TokenDelete: acl.AnonymousTokenID}}),
	} {
		b, _ := proto.Marshal(c)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cmd := &lodestonepb.Command{}
		if proto.Unmarshal(data, cmd) != nil {
			return
		}
		s := New()
		for i, c := range []*lodestonepb.Command{
			putCmd("a", "1"), putCmd("a/b", "2"), putCmd("b", "3"),
			regSvc("n1", "web-1", "web"), regCheck("n1", "c1", "web-1", PASSING), regCheck("n1", "c2", "", PASSING),
			sessCreate(sid(1), "n1", withChecks("c1")), acquireCmd("b", "x", sid(1)),
		} {
			if res, _ := s.Apply(uint64(i+1), at(t0, c)); res.Result == nil || res.Rejected != nil {
				t.Fatalf("setup command %d failed: %v", i, res)
			}
		}
		s.ApplyConfChange(9, []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode, NodeID: 1}}, nil)
		s.Apply(10, admissionCmd(policy(1, true)))
		s.Apply(11, policySet(true, "p1", "p1", `key_prefix "" { policy = "read" }`))
		s.Apply(12, roleSet(true, "r1", "r1", byID("p1")))
		s.Apply(13, bootstrapCmd("acc", "sec"))
		const idx = 14
		res, _ := s.Apply(idx, cmd)
		checkInvariants(t, s)
		if res == nil {
			t.Fatalf("nil result for a new index")
		}
		// Member and admission commands never set Result (no variant).
		noResult := cmd.GetMember() != nil || cmd.GetAdmission() != nil
		if CheckCommand(cmd) == nil && res.Result == nil && !noResult {
			t.Fatalf("valid command %v reported malformed", cmd)
		}
		p, pi := s.Admission()
		switch {
		case cmd.GetAdmission() != nil:
			if pi != idx || !proto.Equal(p, cmd.GetAdmission()) {
				t.Fatalf("admission command: policy %s at %d, want the command's at %d", fmtPolicy(p), pi, idx)
			}
		case pi != 10 || !proto.Equal(p, policy(1, true)):
			t.Fatalf("command %v changed the admission policy to %s at %d", cmd, fmtPolicy(p), pi)
		}
		if got, want := s.Index(), uint64(idx); got != want {
			t.Fatalf("Index = %d, want %d", got, want)
		}
	})
}

// FuzzRestore: arbitrary input either restores (and then survives its own
// round trip) or fails with ErrCorruptSnapshot, never panics, and a failure
// leaves the store as it was.
func FuzzRestore(f *testing.F) {
	s := New()
	s.Apply(1, putCmd("a", "1"))
	s.SetMember(2, &lodestonepb.Member{Id: 1, Name: "n1"})
	f.Add(encode(f, s))
	f.Add(encode(f, New()))
	cs := New()
	for i, c := range []*lodestonepb.Command{
		regSvc("n1", "web-1", "web"), regCheck("n1", "c1", "web-1", PASSING), sessCreate(sid(1), "n1", withChecks("c1")),
		acquireCmd("k", "v", sid(1)), putCmd("gone", "x"), delCmd("gone"), sessCreate(sid(2), "n1"), acquireCmd("j", "v", sid(2)), sessDestroy(sid(2)),
	} {
		cs.Apply(uint64(i+1), at(t0, c))
	}
	f.Add(encode(f, cs))
	cs.Apply(cs.Index()+1, admissionCmd(policy(3, true)))
	f.Add(encode(f, cs))
	cs.Apply(cs.Index()+1, bootstrapCmd("acc", "sec"))
	cs.Apply(cs.Index()+1, policySet(true, "p1", "p1", `key_prefix "" { policy = "read" }`))
	cs.Apply(cs.Index()+1, roleSet(true, "r1", "r1", byID("p1")))
	cs.Apply(cs.Index()+1, tokenSet(true, "a1", "s1", nil, []*lodestonepb.ACLLink{byID("r1")}))
	f.Add(encode(f, cs))
	enc, _ := proto.Marshal(policy(3, true))
	f.Add(newRaw(2).keyAt("_a", nil, 1, 1).keyAt(legacyAdmissionKey, enc, 2, 2).trailerOld(2, 3, 2, 0, 2).bytes())
	f.Add([]byte("LDSTSNAP"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := New()
		s.Apply(7, putCmd("keep", "me"))
		err := s.Restore(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrCorruptSnapshot) {
				t.Fatalf("err = %v, want ErrCorruptSnapshot", err)
			}
			if kv, idx := s.Get([]byte("keep")); kv == nil || idx != 7 {
				t.Fatalf("failed restore changed the store")
			}
			return
		}
		checkInvariants(t, s)
		// What restores must survive its own round trip.
		again := New()
		if err := again.Restore(bytes.NewReader(encode(t, s))); err != nil {
			t.Fatalf("re-encoded snapshot refused: %v", err)
		}
		if got, want := dump(again), dump(s); got != want {
			t.Fatalf("round trip changed the state:\n%s\nwant\n%s", got, want)
		}
	})
}
