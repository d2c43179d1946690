package store

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// EventType says what happened to a key.
type EventType uint8

const (
	// EventPut: the key was created or overwritten.
	EventPut EventType = iota + 1
	// EventDelete: the key was removed.
	EventDelete
)

func (t EventType) String() string {
	switch t {
	case EventPut:
		return "put"
	case EventDelete:
		return "delete"
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// Event describes the net change of one key made by one applied command.
// A command yields at most one event per key (a transaction that sets a key
// twice yields one put with the final entry; one that creates and then
// deletes a key that did not exist before yields none). KV events come
// first, ordered by the first operation that touched each key; catalog and
// session events (keys in the reserved NUL namespace, see doc.go) follow,
// sorted by key. The watch hub consumes them.
//
// KV and PrevKV are shared with the store: consumers must not modify them.
type Event struct {
	Type EventType
	// KV is the entry as stored after the command for EventPut. For
	// EventDelete it carries only Key and ModifyIndex (= the index of the
	// deleting command).
	KV *lodestonepb.KeyValue
	// PrevKV is the entry before the command, nil if the key did not exist.
	// Always nil for catalog and session events.
	PrevKV *lodestonepb.KeyValue
}

// change is one mutation of the tree, kept so a transaction can be undone,
// events derived and replaced values freed: the key, the row before the
// mutation and the row after it (nil: absent), and cur's value bytes when
// the command brought them (hasValue false: cur keeps a value already in
// the value file).
type change struct {
	key       []byte
	prev, cur *row
	value     []byte
	hasValue  bool
}

// applier executes one command against the store. s.mu is held
// exclusively.
type applier struct {
	s     *Store
	index uint64
	// now is the command's time_unix_nano: the only clock Apply knows.
	now     int64
	changes []change    // KV mutations, for undo and events
	cat     *catChanges // catalog/session changes, nil until the first
	// derUndo, while a catalog transaction runs (txn_catalog.go), reverts
	// its changes to the derived lookups that are plain maps; nil outside
	// one, so other commands record nothing.
	derUndo *[]func()
}

func (a *applier) get(key []byte) *row {
	it, _ := a.s.kv.Get(probe(key))
	return it.r
}

// set stores value and flags under key, keeping an existing entry's
// CreateIndex and lock fields, and returns the entry without its value.
// It keeps the key slice (see Apply: the command's key is the store's).
func (a *applier) set(key, value []byte, flags uint64) *lodestonepb.KeyValue {
	r := &row{CreateIndex: a.index, ModifyIndex: a.index, Flags: flags, value: a.s.putValue(value)}
	old, replaced := a.s.kv.ReplaceOrInsert(keep(key, r))
	var prev *row
	if replaced {
		// NB: r is completed after insertion to save a second tree
		// walk; no reader can see it yet (the write lock is held).
		prev = old.r
		r.CreateIndex = prev.CreateIndex
		r.lock = prev.lock
	}
	a.changes = append(a.changes, change{key: key, prev: prev, cur: r, value: value, hasValue: true})
	return meta(key, r)
}

// write stores r, complete with its indices and lock fields, under key,
// with value as its new value, and records the change.
func (a *applier) write(key []byte, r *row, value []byte) {
	r.value = a.s.putValue(value)
	a.replace(key, r, change{value: value, hasValue: true})
}

// replace stores r under key and records c, completed with the key and
// both rows.
func (a *applier) replace(key []byte, r *row, c change) {
	old, replaced := a.s.kv.ReplaceOrInsert(keep(key, r))
	if replaced {
		c.prev = old.r
	}
	a.s.noteLock(key, c.prev, r)
	c.key, c.cur = key, r
	a.changes = append(a.changes, c)
}

// del removes key; it reports whether the key existed.
func (a *applier) del(key []byte) bool {
	prev, ok := a.s.kv.Delete(probe(key))
	if ok {
		a.s.noteLock(prev.key(), prev.r, nil)
		a.changes = append(a.changes, change{key: prev.key(), prev: prev.r})
	}
	return ok
}

// noteLock keeps der.sessionKeys exact when key's entry changes from prev
// to cur (either may be nil). set never changes Session, so only replace,
// del, delPrefix and undo call it.
func (s *Store) noteLock(key []byte, prev, cur *row) {
	var was, is string
	if prev != nil {
		was = prev.session()
	}
	if cur != nil {
		is = cur.session()
	}
	if was == is {
		return
	}
	if was != "" {
		delFromSet(s.der.sessionKeys, was, string(key))
	}
	if is != "" {
		addToSet(s.der.sessionKeys, is, string(key))
	}
}

// delPrefix removes every key starting with prefix and returns how many.
func (a *applier) delPrefix(prefix []byte) uint64 {
	var doomed []item
	a.s.kv.AscendGreaterOrEqual(probe(prefix), func(it item) bool {
		if !bytes.HasPrefix(it.key(), prefix) {
			return false
		}
		doomed = append(doomed, it)
		return true
	})
	// NB: collect first, delete after: the B-tree must not be mutated
	// while it is being iterated.
	for _, it := range doomed {
		a.s.kv.Delete(it)
		a.s.noteLock(it.key(), it.r, nil)
		a.changes = append(a.changes, change{key: it.key(), prev: it.r})
	}
	return uint64(len(doomed))
}

// undo reverts every change in reverse order and frees the values the
// reverted changes stored.
func (a *applier) undo() {
	for i := len(a.changes) - 1; i >= 0; i-- {
		c := a.changes[i]
		if c.prev == nil {
			a.s.kv.Delete(probe(c.key))
		} else {
			a.s.kv.ReplaceOrInsert(keep(c.key, c.prev))
		}
		a.s.noteLock(c.key, c.cur, c.prev)
		if c.cur != nil && (c.prev == nil || c.cur.value != c.prev.value) {
			a.s.values.Free(c.cur.value)
		}
	}
	a.changes = nil
}

// commit frees the values that the command's changes replaced or
// deleted. NB: only once the command is done: an undo must find them, and
// events read them.
func (a *applier) commit() {
	for _, c := range a.changes {
		if c.prev != nil && (c.cur == nil || c.cur.value != c.prev.value) {
			a.s.values.Free(c.prev.value)
		}
	}
}

// events derives the net change per key from a.changes (see Event): the
// state before the first change of each key against the state after its
// last one, in order of first change.
func (a *applier) events() []Event {
	if len(a.changes) == 0 {
		return nil
	}
	nets := make([]change, 0, len(a.changes))
	var pos map[string]int
	if len(a.changes) > 1 {
		pos = make(map[string]int, len(a.changes))
	}
	for _, c := range a.changes {
		if pos != nil {
			if i, dup := pos[string(c.key)]; dup {
				prev := nets[i].prev
				nets[i] = c
				nets[i].prev = prev
				continue
			}
			pos[string(c.key)] = len(nets)
		}
		nets = append(nets, c)
	}
	evs := make([]Event, 0, len(nets))
	for _, n := range nets {
		var prev *lodestonepb.KeyValue
		if n.prev != nil {
			prev = a.s.prevEntry(n.key, n.prev)
		}
		switch {
		case n.cur != nil:
			cur := meta(n.key, n.cur)
			if n.hasValue {
				if len(n.value) > 0 {
					cur.Value = n.value
				}
			} else if n.prev != nil && n.prev.value == n.cur.value {
				cur.Value = prev.Value // NB: read once for both
			} else if n.cur.value.Len() > 0 {
				cur.Value = mustRead(a.s.values.ReadOnce, n.cur.value)
			}
			evs = append(evs, Event{Type: EventPut, KV: cur, PrevKV: prev})
		case n.prev != nil:
			evs = append(evs, Event{Type: EventDelete,
				KV:     &lodestonepb.KeyValue{Key: n.key, ModifyIndex: a.index},
				PrevKV: prev})
		}
	}
	return evs
}

// Apply applies one committed command at Raft log index index and returns
// its result and the events it produced.
//
// Contract:
//   - index <= Index(): a replay (e.g. after restart from an older
//     snapshot); nothing changes, Apply returns (nil, nil).
//   - Otherwise the applied index becomes index, whatever the command.
//   - Deterministic: the result, the events and the new state depend only
//     on the prior state, index and cmd. Limits are NOT enforced here
//     (replicas may be configured differently); only CheckCommand's
//     structural rules are.
//   - A command CheckCommand refuses changes nothing but the index. For
//     put, delete, catalog and session commands the result has no Result
//     set (Result == nil): the server should answer the proposer with
//     CheckCommand(cmd). For a transaction the result is a TxnResponse
//     with succeeded=false and an error per malformed op.
//   - Every Command variant is applied here, member and admission
//     included; the server keeps no apply logic of its own. Conf-change
//     entries, which are not Commands, go to ApplyConfChange.
//   - Never panics on command content.
//   - Apply keeps the key slices of cmd's KV operations (puts,
//     transaction sets, lock puts) as the stored entry's, and their value
//     slices in the events: the caller hands them over and must not modify
//     them afterwards. The value itself is copied into the value file.
//     Nothing else of cmd is retained.
//
// Results: Put → PutResponse.kv is the entry as stored, without value; on a
// cas mismatch nothing changes, CasFailed is set and kv is the current
// entry (without value) or nil. Delete → DeleteResponse.deleted counts
// removed keys (a missing key is not an error); cas mismatch as for put.
// Txn → see TxnResponse; CasFailed stays false (succeeded says it). A put
// with acquire or release that does not take effect sets LockFailed (kv is
// the current entry); one naming an unknown session sets Rejected. Catalog
// and session commands → their response message; a precondition the state
// does not meet (see doc.go) sets Rejected and changes nothing. Member and
// admission commands → an empty result (CommandResult has no variant for
// them, so Result is always nil; CheckCommand(cmd) == nil says it took
// effect and the index is the answer). Headers are left nil for the server
// to fill.
//
// Member (a member publishing its client addresses): an existing member's
// grpc_addr and http_addr are replaced and MembersIndex moves; other fields
// are ignored (voting rights change only by conf change); an unknown id
// changes nothing but the index. No events.
//
// Admission: the policy, as proposed, becomes the one Admission returns,
// stamped with index. It is replicated state of its own, in snapshots, not
// a key: no event, KVIndex does not move, and no KV command can change it
// (the key _lodestone/admission that older builds used is an ordinary key).
//
// Returned results and events may share entries with the store; callers
// must not modify them.
func (s *Store) Apply(index uint64, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, []Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if index <= s.index {
		return nil, nil
	}
	s.index = index
	a := &applier{s: s, index: index, now: cmd.GetTimeUnixNano()}
	var res *lodestonepb.CommandResult
	switch op := cmd.GetOp().(type) {
	case *lodestonepb.Command_Put:
		res = a.put(op.Put)
	case *lodestonepb.Command_Delete:
		res = a.delete(op.Delete)
	case *lodestonepb.Command_Txn:
		res = a.txn(op.Txn)
	case *lodestonepb.Command_CatalogRegister:
		res = a.catalogRegister(op.CatalogRegister)
	case *lodestonepb.Command_CatalogDeregister:
		res = a.catalogDeregister(op.CatalogDeregister)
	case *lodestonepb.Command_CheckUpdate:
		res = a.checkUpdate(op.CheckUpdate)
	case *lodestonepb.Command_SessionCreate:
		res = a.sessionCreate(op.SessionCreate)
	case *lodestonepb.Command_SessionDestroy:
		res = a.sessionDestroy(op.SessionDestroy)
	case *lodestonepb.Command_SessionRenew:
		res = a.sessionRenew(op.SessionRenew)
	case *lodestonepb.Command_SessionInvalidate:
		res = a.sessionInvalidate(op.SessionInvalidate)
	case *lodestonepb.Command_CatalogTxn:
		res = a.catalogTxn(op.CatalogTxn)
	case *lodestonepb.Command_Member:
		// NB: membership bookkeeping, like SetMember: no events and no
		// tombstone pruning, so a member command changes exactly what it
		// did when the server applied it itself.
		return a.setMemberAttrs(op.Member), nil
	case *lodestonepb.Command_Admission:
		res = a.setAdmission(op.Admission)
	case *lodestonepb.Command_Acl:
		res = a.applyACL(op.Acl)
	case *lodestonepb.Command_Restore:
		res = a.restoreState(op.Restore)
	default:
		res = &lodestonepb.CommandResult{}
	}
	evs := a.events()
	a.commit()
	if len(evs) > 0 {
		s.kvIndex = index
		s.recordTombstones(index, evs)
	}
	evs = append(evs, a.finishCatalog()...)
	s.pruneTombstones(index)
	return res, evs
}

func (a *applier) put(p *lodestonepb.PutRequest) *lodestonepb.CommandResult {
	if p == nil || checkPut(p) != nil {
		return &lodestonepb.CommandResult{}
	}
	if p.Cas != nil {
		cur := a.get(p.Key)
		if why := casMismatch(p.Key, cur, *p.Cas); why != "" {
			return &lodestonepb.CommandResult{
				Result:    &lodestonepb.CommandResult_Put{Put: &lodestonepb.PutResponse{Kv: meta(p.Key, cur)}},
				CasFailed: true,
			}
		}
	}
	if p.Acquire || p.Release {
		return a.lockPut(p)
	}
	kv := a.set(p.Key, p.Value, p.Flags)
	return &lodestonepb.CommandResult{
		Result: &lodestonepb.CommandResult_Put{Put: &lodestonepb.PutResponse{Kv: kv}},
	}
}

func (a *applier) delete(d *lodestonepb.DeleteRequest) *lodestonepb.CommandResult {
	if d == nil || checkKey(-1, d.Key) != nil || (d.Prefix && d.Cas != nil) {
		return &lodestonepb.CommandResult{}
	}
	resp := &lodestonepb.DeleteResponse{}
	res := &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_Delete{Delete: resp}}
	switch {
	case d.Prefix:
		resp.Deleted = a.delPrefix(d.Key)
	case d.Cas != nil && casMismatch(d.Key, a.get(d.Key), *d.Cas) != "":
		res.CasFailed = true
	default:
		if a.del(d.Key) {
			resp.Deleted = 1
		}
	}
	return res
}

// casMismatch returns "" when cur matches want (want 0: key absent;
// otherwise: ModifyIndex == want), else why not.
func casMismatch(key []byte, cur *row, want uint64) string {
	switch {
	case want == 0 && cur != nil:
		return fmt.Sprintf("key %q exists with ModifyIndex %d, want absent", key, cur.ModifyIndex)
	case want == 0:
		return ""
	case cur == nil:
		return fmt.Sprintf("key %q does not exist, want ModifyIndex %d", key, want)
	case cur.ModifyIndex != want:
		return fmt.Sprintf("key %q ModifyIndex is %d, want %d", key, cur.ModifyIndex, want)
	}
	return ""
}

// txn runs the ops in order, each seeing the effects of the earlier ones,
// directly on the tree while recording an undo log. If any op fails, every
// change is undone (all-or-nothing); readers cannot see the intermediate
// state because the write lock is held throughout. Every failing op is
// reported, not just the first (as Consul does); ops after a failed one
// still run so their checks are reported against the state they would
// have seen.
func (a *applier) txn(t *lodestonepb.TxnRequest) *lodestonepb.CommandResult {
	resp := &lodestonepb.TxnResponse{}
	res := &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_Txn{Txn: resp}}
	if t == nil || len(t.Ops) == 0 {
		resp.Errors = []*lodestonepb.TxnError{{What: "transaction has no operations"}}
		return res
	}
	// Structural problems first: a malformed txn runs nothing.
	for i, o := range t.Ops {
		if err := checkTxnOp(i, o); err != nil {
			what := err.Error()
			var ie *InvalidError
			if errors.As(err, &ie) {
				what = ie.Detail // op_index already says which op
			}
			resp.Errors = append(resp.Errors, &lodestonepb.TxnError{OpIndex: uint32(i), What: what})
		}
	}
	if len(resp.Errors) > 0 {
		return res
	}
	results := make([]*lodestonepb.TxnResult, len(t.Ops))
	fail := func(i int, why string) {
		resp.Errors = append(resp.Errors, &lodestonepb.TxnError{OpIndex: uint32(i), What: why})
	}
	for i, o := range t.Ops {
		results[i] = a.txnKVOp(i, o, fail)
	}
	if len(resp.Errors) > 0 {
		a.undo()
		return res
	}
	resp.Succeeded = true
	resp.Results = results
	return res
}

// txnKVOp runs one KV operation of a transaction (op i) and returns its
// result; a failed check calls fail and changes nothing.
func (a *applier) txnKVOp(i int, o *lodestonepb.TxnOp, fail func(int, string)) *lodestonepb.TxnResult {
	r := &lodestonepb.TxnResult{}
	switch o.Verb {
	case lodestonepb.TxnOp_SET:
		r.Kv = a.set(o.Key, o.Value, o.Flags)
	case lodestonepb.TxnOp_GET:
		r.Kv = a.s.entry(o.Key, a.get(o.Key))
	case lodestonepb.TxnOp_DELETE:
		if a.del(o.Key) {
			r.Deleted = 1
		}
	case lodestonepb.TxnOp_DELETE_PREFIX:
		r.Deleted = a.delPrefix(o.Key)
	case lodestonepb.TxnOp_CAS:
		if why := casMismatch(o.Key, a.get(o.Key), o.Index); why != "" {
			fail(i, why)
			return r
		}
		r.Kv = a.set(o.Key, o.Value, o.Flags)
	case lodestonepb.TxnOp_CHECK_INDEX:
		cur := a.get(o.Key)
		switch {
		case cur == nil:
			fail(i, fmt.Sprintf("key %q does not exist, want ModifyIndex %d", o.Key, o.Index))
		case cur.ModifyIndex != o.Index:
			fail(i, fmt.Sprintf("key %q ModifyIndex is %d, want %d", o.Key, cur.ModifyIndex, o.Index))
		}
	case lodestonepb.TxnOp_CHECK_NOT_EXISTS:
		if cur := a.get(o.Key); cur != nil {
			fail(i, fmt.Sprintf("key %q exists with ModifyIndex %d, want absent", o.Key, cur.ModifyIndex))
		}
	case lodestonepb.TxnOp_DELETE_CAS:
		if why := casMismatch(o.Key, a.get(o.Key), o.Index); why != "" {
			fail(i, why)
			return r
		}
		if a.del(o.Key) {
			r.Deleted = 1
		}
	case lodestonepb.TxnOp_LOCK:
		kv, outcome, why := a.acquire(o.Key, o.Value, o.Flags, o.Session)
		if outcome != lockOK {
			fail(i, why)
			return r
		}
		r.Kv = kv
	case lodestonepb.TxnOp_UNLOCK:
		kv, outcome, why := a.release(o.Key, o.Value, o.Flags, o.Session)
		if outcome != lockOK {
			fail(i, why)
			return r
		}
		r.Kv = kv
	case lodestonepb.TxnOp_CHECK_SESSION:
		switch cur := a.get(o.Key); {
		case cur == nil:
			fail(i, fmt.Sprintf("key %q does not exist, want it held by session %q", o.Key, o.Session))
		case cur.session() != o.Session:
			fail(i, fmt.Sprintf("key %q is held by session %q, want %q", o.Key, cur.session(), o.Session))
		}
	}
	return r
}
