package store

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// step is one committed Raft entry as the server would hand it over.
type step struct {
	index   uint64
	cmd     []byte              // marshaled Command; nil for the other kinds
	member  *lodestonepb.Member // 'm': the member; 'x': the context member (may be nil)
	remove  uint64              // member id to remove
	changes []raftpb.ConfChangeSingle
	// kind: 'c' command, 'm' set member, 'r' remove member, 'a' advance,
	// 'x' conf change (ApplyConfChange)
	kind byte
}

// testSeed returns the seed from LODESTONE_SEED or a fresh one, and logs it
// on failure so the run can be repeated.
func testSeed(t testing.TB) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if v := os.Getenv("LODESTONE_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("LODESTONE_SEED: %v", err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (rerun with LODESTONE_SEED=%d)", seed, seed)
		}
	})
	return seed
}

// randomSteps builds n entries from seed: puts, cas puts, deletes, prefix
// deletes and transactions over a small key space (so they collide),
// membership changes, empty entries, replays and index gaps; catalog
// registrations, deregistrations and check updates over a few nodes,
// services and checks; sessions created, destroyed, renewed and
// invalidated from a small id pool; acquires, releases and txn lock ops;
// member and admission commands, writes to the key that older builds kept
// the admission policy under, and conf changes.
// cas indices are drawn near the current index so some match and some do
// not. Every command carries a proposer time that mostly moves forward
// (sometimes back: clock skew between proposers).
func randomSteps(seed uint64, n int) []step {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	key := func() string {
		return fmt.Sprintf("%s/%d", []string{"a", "ab", "b", "svc/web", "svc/db"}[r.IntN(5)], r.IntN(8))
	}
	prefix := func() string { return []string{"a", "ab", "b", "svc/", "svc/web", "s"}[r.IntN(6)] }
	val := func() string { return strconv.Itoa(r.IntN(1000)) }
	var idx uint64
	near := func() uint64 {
		if idx < 10 || r.IntN(4) == 0 {
			return uint64(r.IntN(int(idx + 1)))
		}
		return idx - uint64(r.IntN(10))
	}
	now := t0
	nodeName := func() string { return fmt.Sprintf("n%d", r.IntN(4)) }
	svcID := func() string { return []string{"web-0", "web-1", "db-0"}[r.IntN(3)] }
	chkID := func() string { return fmt.Sprintf("c%d", r.IntN(4)) }
	session := func() string { return sid(1 + r.IntN(6)) }
	status := func() lodestonepb.HealthStatus {
		return []lodestonepb.HealthStatus{PASSING, PASSING, PASSING, WARNING, CRITICAL, ANY}[r.IntN(6)]
	}
	catalogCmd := func() *lodestonepb.Command {
		switch k := r.IntN(100); {
		case k < 35:
			reg := &lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: nodeName(), Address: fmt.Sprintf("10.0.0.%d", r.IntN(2))}}
			reg.SkipNodeUpdate = r.IntN(10) == 0
			if r.IntN(2) == 0 {
				id := svcID()
				reg.Service = &lodestonepb.Service{Id: id, Name: id[:len(id)-2], Tags: []string{"v1", "v2"}[:r.IntN(3)%2+r.IntN(2)], Port: uint32(r.IntN(2))}
			}
			for range r.IntN(3) {
				c := &lodestonepb.Check{CheckId: chkID(), Status: status(), Output: val()}
				if r.IntN(2) == 0 {
					c.ServiceId = svcID()
				}
				reg.Checks = append(reg.Checks, c)
			}
			return register(reg)
		case k < 45:
			switch r.IntN(4) {
			case 0:
				return dereg(nodeName(), "", "")
			case 1, 2:
				return dereg(nodeName(), svcID(), "")
			default:
				return dereg(nodeName(), "", chkID())
			}
		case k < 55:
			return checkUpd(nodeName(), chkID(), status()%4+lodestonepb.HealthStatus(r.IntN(2)), val())
		case k < 75:
			var opts []sessOpt
			if r.IntN(2) == 0 {
				opts = append(opts, withChecks(chkID()))
			}
			if r.IntN(3) == 0 {
				opts = append(opts, withDelete())
			}
			if r.IntN(2) == 0 {
				opts = append(opts, withTTL(10*time.Second))
			}
			if r.IntN(2) == 0 {
				opts = append(opts, withLockDelay(time.Duration(r.IntN(3))*time.Second))
			}
			return sessCreate(session(), nodeName(), opts...)
		case k < 80:
			return sessDestroy(session())
		case k < 85:
			return sessRenew(session())
		case k < 90:
			if r.IntN(2) == 0 {
				return sessInvalidate(nodeName(), 0)
			}
			return sessInvalidate("", now*int64(r.IntN(2)), session(), session())
		case k < 96:
			return acquireCmd(key(), val(), session())
		default:
			return releaseCmd(key(), val(), session())
		}
	}
	txnOp := func() *lodestonepb.TxnOp {
		verbs := []lodestonepb.TxnOp_Verb{SET, SET, GET, DELETE, DELETE_PREFIX, CAS, CHECK_INDEX, CHECK_NOT_EXISTS, DELETE_CAS, LOCK, UNLOCK, CHECK_SESSION}
		o := &lodestonepb.TxnOp{Verb: verbs[r.IntN(len(verbs))], Key: []byte(key())}
		switch o.Verb {
		case LOCK, UNLOCK:
			o.Value, o.Session = []byte(val()), session()
		case CHECK_SESSION:
			o.Session = session()
		case SET:
			o.Value, o.Flags = []byte(val()), uint64(r.IntN(3))
		case CAS:
			o.Value, o.Index = []byte(val()), near()
		case CHECK_INDEX, DELETE_CAS:
			o.Index = near()
		case DELETE_PREFIX:
			o.Key = []byte(prefix())
		}
		return o
	}
	var steps []step
	for len(steps) < n {
		idx += 1
		if r.IntN(20) == 0 {
			idx += uint64(r.IntN(5)) // a gap (entries applied elsewhere, e.g. skipped by a snapshot)
		}
		now += int64(r.IntN(3000)-300) * int64(time.Millisecond)
		var cmd *lodestonepb.Command
		switch k := r.IntN(182); {
		case k < 40:
			cmd = putFlags(key(), val(), uint64(r.IntN(2)))
		case k < 50:
			cmd = putCAS(key(), val(), near())
		case k < 60:
			cmd = delCmd(key())
		case k < 64:
			cmd = delCAS(key(), near())
		case k < 68:
			cmd = delPrefix(prefix())
		case k < 88:
			ops := make([]*lodestonepb.TxnOp, 1+r.IntN(6))
			for i := range ops {
				ops[i] = txnOp()
			}
			cmd = txnCmd(ops...)
		case k < 91:
			id := uint64(1 + r.IntN(5))
			steps = append(steps, step{index: idx, kind: 'm', member: &lodestonepb.Member{
				Id: id, Name: fmt.Sprintf("n%d", id), PeerAddr: fmt.Sprintf("10.0.0.%d:7401", id), Learner: r.IntN(2) == 0}})
			continue
		case k < 93:
			steps = append(steps, step{index: idx, kind: 'r', remove: uint64(1 + r.IntN(5))})
			continue
		case k < 96:
			steps = append(steps, step{index: idx, kind: 'a'})
			continue
		case k < 98:
			// A replay of an older entry: must be a no-op.
			b, _ := proto.Marshal(putCmd(key(), "replayed"))
			steps = append(steps, step{index: idx - 1 - uint64(r.IntN(int(idx))), kind: 'c', cmd: b})
			idx--
			continue
		case k < 100:
			cmd = &lodestonepb.Command{} // malformed: no op
		case k < 170:
			cmd = catalogCmd()
		case k < 173:
			id := uint64(1 + r.IntN(6)) // 6 is never a member
			cmd = memberCmd(id, fmt.Sprintf("10.0.1.%d:%d", id, r.IntN(3)), fmt.Sprintf("10.0.2.%d:%d", id, r.IntN(3)))
		case k < 176:
			cmd = admissionCmd(&lodestonepb.AdmissionPolicy{Enabled: r.IntN(4) > 0, Reads: uint64(r.IntN(3) * 100),
				Writes: uint64(r.IntN(3) * 50), Watches: uint64(r.IntN(2) * 10), RampPercentPerMin: float64(r.IntN(3) * 5), SetUnixNano: now})
		case k < 178:
			if r.IntN(3) == 0 {
				cmd = delCmd(legacyAdmissionKey)
			} else {
				cmd = putCmd(legacyAdmissionKey, val()) // an ordinary key now
			}
		default:
			types := []raftpb.ConfChangeType{raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode,
				raftpb.ConfChangeRemoveNode, raftpb.ConfChangeUpdateNode}
			changes := make([]raftpb.ConfChangeSingle, 1+r.IntN(3))
			for i := range changes {
				changes[i] = raftpb.ConfChangeSingle{Type: types[r.IntN(len(types))], NodeID: uint64(r.IntN(6))} // 0: skipped
			}
			var ctx *lodestonepb.Member
			if r.IntN(3) > 0 {
				id := changes[r.IntN(len(changes))].NodeID
				ctx = &lodestonepb.Member{Id: id, Name: fmt.Sprintf("n%d", id), PeerAddr: fmt.Sprintf("10.0.0.%d:%d", id, 7400+r.IntN(2)),
					GrpcAddr: fmt.Sprintf("10.0.1.%d:1", id)}
			}
			steps = append(steps, step{index: idx, kind: 'x', changes: changes, member: ctx})
			continue
		}
		cmd.TimeUnixNano = now
		b, err := proto.Marshal(cmd)
		if err != nil {
			panic(err)
		}
		steps = append(steps, step{index: idx, kind: 'c', cmd: b})
	}
	// NB: removes are a random walk over five ids, so about 1 stream in
	// 100 would end with no member; the end state must hold one for the
	// snapshot of members to be tested.
	idx++
	return append(steps, step{index: idx, kind: 'm', member: &lodestonepb.Member{Id: 1, Name: "n1", PeerAddr: "10.0.0.1:7401"}})
}

// run feeds steps to s, decoding every command afresh as the server does,
// and returns a transcript of results and events.
func run(t testing.TB, s *Store, steps []step) []string {
	t.Helper()
	var out []string
	for _, st := range steps {
		switch st.kind {
		case 'c':
			cmd := &lodestonepb.Command{}
			if err := proto.Unmarshal(st.cmd, cmd); err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			res, evs := s.Apply(st.index, cmd)
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(res)
			if err != nil {
				t.Fatalf("marshal result: %v", err)
			}
			out = append(out, fmt.Sprintf("%d nil=%v %x %q", st.index, res == nil, b, fmtEvents(evs)))
		case 'm':
			s.SetMember(st.index, st.member)
		case 'r':
			s.RemoveMember(st.index, st.remove)
		case 'a':
			s.Advance(st.index)
		case 'x':
			added, removed := s.ApplyConfChange(st.index, st.changes, st.member)
			line := fmt.Sprintf("%d conf removed=%v added=", st.index, removed)
			for _, m := range added {
				line += fmt.Sprintf("[%d %s %s learner=%v]", m.Id, m.Name, m.PeerAddr, m.Learner)
			}
			out = append(out, line)
		}
	}
	return out
}

// TestDeterminism feeds two stores the same seeded stream: results, events,
// final state and snapshot bytes must be identical.
func TestDeterminism(t *testing.T) {
	seed := testSeed(t)
	steps := randomSteps(seed, 3000)
	a, b := New(), New()
	ta, tb := run(t, a, steps), run(t, b, steps)
	for i := range ta {
		if ta[i] != tb[i] {
			t.Fatalf("step %d differs:\n%s\n%s", i, ta[i], tb[i])
		}
	}
	checkInvariants(t, a)
	if got, want := dump(a), dump(b); got != want {
		t.Fatalf("final states differ:\n%s\nvs\n%s", got, want)
	}
	if got, want := encode(t, a), encode(t, b); string(got) != string(want) {
		t.Fatalf("snapshot bytes differ")
	}
	if p, _ := a.Admission(); a.Len() == 0 || len(a.Members()) == 0 || p == nil {
		t.Errorf("stream too weak: %d keys, %d members, admission policy %v at the end", a.Len(), len(a.Members()), p)
	}
}

// TestRandomStreamCoverage guards the generator: a stream must exercise
// successes and failures of every conditional kind, or the determinism and
// snapshot tests prove little.
func TestRandomStreamCoverage(t *testing.T) {
	seed := testSeed(t)
	s := New()
	counts := map[string]int{}
	for _, st := range randomSteps(seed, 3000) {
		if st.kind != 'c' {
			counts[string(st.kind)]++
			continue
		}
		cmd := &lodestonepb.Command{}
		_ = proto.Unmarshal(st.cmd, cmd)
		res, evs := s.Apply(st.index, cmd)
		switch {
		case res == nil:
			counts["replay"]++
		case cmd.GetMember() != nil:
			counts["member-cmd"]++
		case cmd.GetAdmission() != nil:
			counts["admission"]++
		case res.GetRejected() != nil:
			counts["rejected "+res.GetRejected().GetRule()]++
		case res.GetLockFailed():
			counts["lock-failed"]++
		case res.GetPut() != nil && (cmd.GetPut().GetAcquire() || cmd.GetPut().GetRelease()):
			counts["lock-ok"]++
		case res.GetCatalogRegister() != nil:
			counts["register-ok"]++
		case res.GetCheckUpdate() != nil:
			counts["check-update-ok"]++
		case res.GetSessionCreate() != nil:
			counts["session-create-ok"]++
		case res.GetSessionRenew() != nil:
			counts["session-renew-ok"]++
		case res.GetCasFailed():
			counts["cas-failed"]++
		case res.GetTxn() != nil && res.GetTxn().Succeeded:
			counts["txn-ok"]++
		case res.GetTxn() != nil:
			counts["txn-failed"]++
		case res.Result == nil:
			counts["malformed"]++
		}
		if n := len(res.GetSessionInvalidate().GetInvalidated()); n > 0 || res.GetSessionDestroy().GetDestroyed() {
			counts["session-invalidated"]++
		}
		if res.GetCatalogDeregister().GetInvalidatedSessions() > 0 {
			counts["deregister-invalidated"]++
		}
		for _, e := range evs {
			kind := e.Type.String()
			if IsReservedKey(e.KV.Key) {
				kind = "catalog-" + kind
			} else if e.KV.Session != "" {
				kind = "locked-put"
			}
			counts[kind]++
		}
	}
	for _, k := range []string{"replay", "cas-failed", "txn-ok", "txn-failed", "malformed", "put", "delete", "m", "r", "a", "x",
		"member-cmd", "admission",
		"rejected " + RejectNodeMissing, "rejected " + RejectServiceMissing, "rejected " + RejectCheckMissing,
		"rejected " + RejectCheckCritical, "rejected " + RejectSessionMissing, "rejected " + RejectSessionIDTaken,
		"lock-failed", "lock-ok", "register-ok", "check-update-ok", "session-create-ok", "session-renew-ok",
		"session-invalidated", "deregister-invalidated", "catalog-put", "catalog-delete", "locked-put"} {
		min := 5
		if k == "rejected "+RejectCheckCritical {
			min = 1 // needs a session bound to an existing check that is critical: rare
		}
		if counts[k] < min {
			t.Errorf("stream has %d %q, want at least %d (counts %v)", counts[k], k, min, counts)
		}
	}
}

func TestRandomStepsAreReproducible(t *testing.T) {
	a, b := randomSteps(42, 200), randomSteps(42, 200)
	if !slices.EqualFunc(a, b, func(x, y step) bool {
		return x.index == y.index && x.kind == y.kind && string(x.cmd) == string(y.cmd) && x.remove == y.remove && proto.Equal(x.member, y.member) &&
			slices.Equal(x.changes, y.changes)
	}) {
		t.Fatalf("same seed, different streams")
	}
}
