package store

import (
	"bytes"
	"fmt"
	"google.golang.org/protobuf/encoding/prototext"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store/valuefile"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Command builders.

func putCmd(key, value string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_Put{Put: &lodestonepb.PutRequest{Key: []byte(key), Value: []byte(value)}}}
}

func putFlags(key, value string, flags uint64) *lodestonepb.Command {
	c := putCmd(key, value)
	c.GetPut().Flags = flags
	return c
}

func putCAS(key, value string, cas uint64) *lodestonepb.Command {
	c := putCmd(key, value)
	c.GetPut().Cas = proto.Uint64(cas)
	return c
}

func delCmd(key string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_Delete{Delete: &lodestonepb.DeleteRequest{Key: []byte(key)}}}
}

func delPrefix(prefix string) *lodestonepb.Command {
	c := delCmd(prefix)
	c.GetDelete().Prefix = true
	return c
}

func delCAS(key string, cas uint64) *lodestonepb.Command {
	c := delCmd(key)
	c.GetDelete().Cas = proto.Uint64(cas)
	return c
}

func txnCmd(ops ...*lodestonepb.TxnOp) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_Txn{Txn: &lodestonepb.TxnRequest{Ops: ops}}}
}

func op(verb lodestonepb.TxnOp_Verb, key string) *lodestonepb.TxnOp {
	return &lodestonepb.TxnOp{Verb: verb, Key: []byte(key)}
}

func opSet(key, value string) *lodestonepb.TxnOp {
	o := op(lodestonepb.TxnOp_SET, key)
	o.Value = []byte(value)
	return o
}

func opCAS(key, value string, index uint64) *lodestonepb.TxnOp {
	o := op(lodestonepb.TxnOp_CAS, key)
	o.Value, o.Index = []byte(value), index
	return o
}

func opIdx(verb lodestonepb.TxnOp_Verb, key string, index uint64) *lodestonepb.TxnOp {
	o := op(verb, key)
	o.Index = index
	return o
}

// applier drives a store with consecutive indices.
type driver struct {
	t *testing.T
	s *Store
}

func newDriver(t *testing.T) *driver { return &driver{t: t, s: New()} }

// apply applies cmd at Index()+1 and checks the invariants afterwards.
func (d *driver) apply(cmd *lodestonepb.Command) (*lodestonepb.CommandResult, []Event) {
	d.t.Helper()
	res, evs := d.s.Apply(d.s.Index()+1, cmd)
	checkInvariants(d.t, d.s)
	return res, evs
}

func (d *driver) applyAll(cmds ...*lodestonepb.Command) {
	d.t.Helper()
	for _, c := range cmds {
		d.apply(c)
	}
}

// checkInvariants verifies what must hold after every command: keys
// strictly ordered and valid, CreateIndex <= ModifyIndex <= KVIndex <=
// Index, member ids non-zero, and checkCatalogInvariants.
func checkInvariants(t *testing.T, s *Store) {
	t.Helper()
	checkACLInvariants(t, s)
	held := map[string]map[string]struct{}{}              // session -> keys, for checkCatalogInvariants
	defer func() { checkCatalogInvariants(t, s, held) }() // after the unlock below
	s.mu.RLock()
	defer s.mu.RUnlock()
	var prev []byte
	first := true
	refs := map[valuefile.Ref]string{}
	s.kv.Ascend(func(it item) bool {
		kv := meta(it.key(), it.r)
		if v := it.r.value; v.Len() > 0 {
			if other, dup := refs[v]; dup {
				t.Errorf("invariant: keys %q and %q share the %v", other, it.key(), v)
			}
			refs[v] = string(it.key())
		}
		switch {
		case len(kv.Key) == 0:
			t.Errorf("invariant: empty key stored")
		case !first && bytes.Compare(prev, kv.Key) >= 0:
			t.Errorf("invariant: key %q not after %q", kv.Key, prev)
		case kv.CreateIndex == 0 || kv.CreateIndex > kv.ModifyIndex:
			t.Errorf("invariant: key %q CreateIndex %d, ModifyIndex %d", kv.Key, kv.CreateIndex, kv.ModifyIndex)
		case kv.ModifyIndex > s.kvIndex:
			t.Errorf("invariant: key %q ModifyIndex %d above KVIndex %d", kv.Key, kv.ModifyIndex, s.kvIndex)
		}
		if kv.Session != "" {
			addToSet(held, kv.Session, string(kv.Key))
		}
		prev, first = kv.Key, false
		return true
	})
	if st := s.values.Stats(); st.Values-st.PendingValues != uint64(len(refs)) {
		t.Errorf("invariant: the value file holds %d values (%d of them freed under a pin), the keys name %d",
			st.Values, st.PendingValues, len(refs))
	}
	if s.kvIndex > s.index || s.membersIndex > s.index {
		t.Errorf("invariant: kvIndex %d / membersIndex %d above index %d", s.kvIndex, s.membersIndex, s.index)
	}
	for id, m := range s.members {
		if id == 0 || m.Id != id {
			t.Errorf("invariant: member stored under %d has id %d", id, m.Id)
		}
	}
}

// dump renders the whole state compactly for comparisons and messages.
func dump(s *Store) string {
	var b strings.Builder
	kvs, _, idx := s.Range(nil, nil, 0, false)
	fmt.Fprintf(&b, "index=%d kvindex=%d membersindex=%d\n", idx, s.KVIndex(), s.MembersIndex())
	for _, kv := range kvs {
		fmt.Fprintf(&b, "%s\n", fmtKV(kv))
	}
	for _, m := range s.Members() {
		fmt.Fprintf(&b, "member %d %s %s %s %s learner=%v\n", m.Id, m.Name, m.PeerAddr, m.GrpcAddr, m.HttpAddr, m.Learner)
	}
	if p, i := s.Admission(); p != nil || i != 0 {
		fmt.Fprintf(&b, "admission %d %s\n", i, fmtPolicy(p))
	}
	// The ACL tables, once a command has changed them (an untouched store
	// holds only the built-ins, which every dump would repeat).
	if s.ACLIndex() != 0 {
		b.WriteString(dumpACL(s))
	}
	return b.String()
}

// dumpACL renders the ACL tables deterministically.
func dumpACL(s *Store) string {
	var b strings.Builder
	fmt.Fprintf(&b, "acl index=%d bootstrap=%d\n", s.ACLIndex(), s.ACLBootstrapIndex())
	mo := prototext.MarshalOptions{}
	ps, _ := s.ACLPolicies()
	for _, p := range ps {
		fmt.Fprintf(&b, "policy %s\n", mo.Format(p))
	}
	rs, _ := s.ACLRoles()
	for _, r := range rs {
		fmt.Fprintf(&b, "role %s\n", mo.Format(r))
	}
	ts, _ := s.ACLTokens()
	for _, t := range ts {
		fmt.Fprintf(&b, "token %s\n", mo.Format(t))
	}
	return b.String()
}

// fmtPolicy renders a policy deterministically; "<nil>" for none.
func fmtPolicy(p *lodestonepb.AdmissionPolicy) string {
	if p == nil {
		return "<nil>"
	}
	return fmt.Sprintf("enabled=%v reads=%d writes=%d watches=%d ramp=%v set=%d",
		p.Enabled, p.Reads, p.Writes, p.Watches, p.RampPercentPerMin, p.SetUnixNano)
}

func admissionCmd(p *lodestonepb.AdmissionPolicy) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_Admission{Admission: p}}
}

func memberCmd(id uint64, grpc, http string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_Member{Member: &lodestonepb.Member{
		Id: id, Name: "ignored", PeerAddr: "ignored:1", GrpcAddr: grpc, HttpAddr: http, Learner: true}}}
}

func fmtKV(kv *lodestonepb.KeyValue) string {
	if kv == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s=%q c=%d m=%d l=%d f=%d s=%q", kv.Key, kv.Value, kv.CreateIndex, kv.ModifyIndex, kv.LockIndex, kv.Flags, kv.Session)
}

func keysOf(kvs []*lodestonepb.KeyValue) []string {
	out := make([]string, len(kvs))
	for i, kv := range kvs {
		out[i] = string(kv.Key)
	}
	return out
}

func encode(t testing.TB, s *Store) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := s.Snapshot().WriteTo(&buf)
	if err != nil {
		t.Fatalf("WriteTo: %v", err)
	}
	if got, want := n, int64(buf.Len()); got != want {
		t.Fatalf("WriteTo returned %d, wrote %d", got, want)
	}
	return buf.Bytes()
}

// dumpKVs renders every entry, one per line, without the indices of the
// store itself.
func dumpKVs(s *Store) string {
	var b strings.Builder
	kvs, _, _ := s.Range(nil, nil, 0, false)
	for _, kv := range kvs {
		fmt.Fprintf(&b, "%s\n", fmtKV(kv))
	}
	return b.String()
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

type writerBuf struct{ b []byte }

func (w *writerBuf) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

// checkACLInvariants: the secondary indices agree with the tables, links
// are by id, and the built-ins exist.
func checkACLInvariants(t *testing.T, s *Store) {
	t.Helper()
	st := s.acls.Load()
	if len(st.secrets) != len(st.tokens) || len(st.policyNames) != len(st.policies) || len(st.roleNames) != len(st.roles) {
		t.Fatalf("ACL indices disagree: %d tokens %d secrets, %d policies %d names, %d roles %d names",
			len(st.tokens), len(st.secrets), len(st.policies), len(st.policyNames), len(st.roles), len(st.roleNames))
	}
	for id, tok := range st.tokens {
		if tok.AccessorId != id || st.secrets[tok.SecretId] != tok {
			t.Fatalf("token %q misfiled", id)
		}
		for _, l := range append(append([]*lodestonepb.ACLLink{}, tok.Policies...), tok.Roles...) {
			if l.Id == "" || l.Name != "" {
				t.Fatalf("token %q link %v not by id only", id, l)
			}
		}
	}
	for id, p := range st.policies {
		if p.Id != id || st.policyNames[p.Name] != p {
			t.Fatalf("policy %q misfiled", id)
		}
	}
	for id, r := range st.roles {
		if r.Id != id || st.roleNames[r.Name] != r {
			t.Fatalf("role %q misfiled", id)
		}
	}
	if st.policies["00000000-0000-0000-0000-000000000001"] == nil || st.tokens["00000000-0000-0000-0000-000000000002"] == nil {
		t.Fatal("a built-in ACL object is missing")
	}
}
