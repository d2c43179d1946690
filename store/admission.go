package store

import (
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// legacyAdmissionKey is the KV key under which builds before snapshot
// version 3 kept the admission policy (a marshaled AdmissionPolicy). It is
// an ordinary key now: writing or deleting it changes no policy. Restore
// moves it out of a version 1 or 2 snapshot into the admission state (see
// SNAPSHOT.md, "Migration from versions 1 and 2").
const legacyAdmissionKey = "_lodestone/admission"

// admissionState is the replicated admission policy and the index of the
// command that set it. Immutable once stored: a new command stores a new
// value.
type admissionState struct {
	policy *lodestonepb.AdmissionPolicy // never nil
	index  uint64                       // never 0
}

// Admission returns the admission policy the cluster last agreed on and
// the index of the command that set it, or (nil, 0) if none was ever set.
// The policy is returned as it was proposed, disabled ones included
// (Enabled false: an operator turned admission control off); deciding what
// to enforce is the caller's. It is shared with the store: callers must not
// modify it.
//
// It takes no lock (one atomic load), so a server may call it on every
// request, or keep what it derives from the policy and derive again when
// the index differs. Compare for inequality, not order: Restore can move
// the index back. NB: the policy becomes visible as soon as its Apply
// stores it, which may be a moment before Index() reaches its index.
func (s *Store) Admission() (*lodestonepb.AdmissionPolicy, uint64) {
	if st := s.admission.Load(); st != nil {
		return st.policy, st.index
	}
	return nil, 0
}

// setAdmission replaces the admission policy with a copy of p, stamped
// with the applying index. It emits no event and moves no KV index: the
// policy is not a key.
func (a *applier) setAdmission(p *lodestonepb.AdmissionPolicy) *lodestonepb.CommandResult {
	if p == nil {
		return &lodestonepb.CommandResult{} // malformed: CheckCommand refuses it
	}
	a.s.admission.Store(&admissionState{policy: proto.CloneOf(p), index: a.index})
	return &lodestonepb.CommandResult{}
}

// migrateAdmission moves the policy that a snapshot written before version
// 3 holds under legacyAdmissionKey out of st.kv into st.admission, stamped
// with the key's ModifyIndex (the index of the command that set it). A
// value that does not decode as a policy migrates as an empty, disabled
// policy: the old build enforced nothing in that case either. The key is
// removed in every case, without a tombstone (it was the policy's storage,
// not user data) and without moving kv_index (which cannot be recomputed:
// it may stay higher than it would be, which costs a blocking query on the
// whole keyspace at most one spurious wake). A key with ModifyIndex 0,
// which no build writes, is removed and sets no policy.
func migrateAdmission(st *decoded) {
	it, ok := st.kv.Delete(probe([]byte(legacyAdmissionKey)))
	if !ok {
		return
	}
	st.dropped = append(st.dropped, it.r.value)
	if it.r.ModifyIndex == 0 {
		return
	}
	p := &lodestonepb.AdmissionPolicy{}
	if err := proto.Unmarshal(st.legacyAdmission, p); err != nil {
		p = &lodestonepb.AdmissionPolicy{}
	}
	st.admission = &admissionState{policy: p, index: it.r.ModifyIndex}
}
