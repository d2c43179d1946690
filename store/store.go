package store

import (
	"bytes"
	"fmt"
	"maps"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/google/btree"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/clusterid"
	"github.com/lodestone-kv/lodestone/store/valuefile"
)

// btreeDegree is the B-tree fan-out. 32 keeps nodes within a few cache lines
// of pointers and the tree shallow (4 levels hold ~1M keys).
const btreeDegree = 32

// Store is the replicated state machine. See the package doc for the
// concurrency contract: one goroutine calls the mutating methods (Apply,
// ApplyConfChange, Advance, SetMember, RemoveMember, Snapshot, Restore, RestoreShared);
// any number of goroutines call the read methods (Get, Range, Members,
// Admission, the catalog and session reads, the index getters)
// concurrently with it.
type Store struct {
	// admission is the replicated admission policy (nil: none ever set).
	// Written by the apply goroutine while it holds mu exclusively, read
	// without mu (Admission): the server checks it on every request.
	admission atomic.Pointer[admissionState]
	// cluster is the id of the cluster this state belongs to (zero: not
	// known yet). It is not changed by commands: the server sets it when
	// it learns the id, and snapshots carry it so a snapshot names its
	// cluster. Atomic because the transport may learn it while Apply runs.
	cluster atomic.Pointer[clusterid.ID]
	// acls is the ACL tables (acl.go), replaced whole by the apply
	// goroutine under mu, read without mu: the resolver reads them on
	// every request.
	acls atomic.Pointer[aclState]

	// mu guards every field below. The apply goroutine holds it exclusively
	// for the whole of one command (so a transaction is never seen half
	// done); readers hold it shared.
	mu sync.RWMutex

	// kv holds the entries ordered by key. Stored *row values are
	// immutable: a write replaces the pointer, never edits the row, so
	// snapshots may share them.
	kv *btree.BTreeG[item]
	// values holds the entries' value bytes, outside the Go heap when it
	// is on disk (valuefile). Put and Free run under mu held exclusively;
	// reads under mu shared, or under a Snapshot's pin.
	values *valuefile.File
	// members by id. Stored *Member values are immutable like kv entries.
	members map[uint64]*lodestonepb.Member

	index        uint64 // last applied Raft index
	kvIndex      uint64 // index of the last command that changed a key
	membersIndex uint64 // index of the last membership change

	// tab holds the catalog, the sessions and the KV side tables
	// (tombstones, lock delays): replicated state, in snapshots.
	tab tables
	// der holds lookup structures derived from kv and tab, rebuilt by
	// Restore and never snapshotted.
	der derived
}

// item is one B-tree slot. NB: the key is held inline so a comparison
// reads the node's own array and the key bytes, not a *row first: that
// halves the cache misses of a lookup, which dominate Get and Apply on a
// large store. The key is an allocation of its own: nothing else may
// share it and be kept alive by it. It is held as a string, not a []byte,
// for the 8 bytes of a slice's capacity in every slot of every node, but
// its bytes are the []byte the store was given (keep) and the one it hands
// out (key): the store never copies a key, and nobody writes to one.
type item struct {
	k string
	r *row
}

// keep is the slot for key and r. It takes key over: the caller must not
// modify or reuse its bytes (Apply's keys are decoded commands'; Restore's
// its own copies).
func keep(key []byte, r *row) item {
	return item{k: unsafe.String(unsafe.SliceData(key), len(key)), r: r}
}

// probe is a slot to look key up by, without copying key: the tree's Get,
// Delete and Ascend calls compare with it and keep nothing of it.
func probe(key []byte) item { return keep(key, nil) }

// key is the slot's key, the bytes keep was given; shared, read-only.
func (it item) key() []byte { return unsafe.Slice(unsafe.StringData(it.k), len(it.k)) }

// row is one key's entry as the tree holds it: Consul's indices and flags,
// where the value lies in the value file, and the lock state. The fields
// are named as lodestonepb.KeyValue's. NB: not a *KeyValue: a protobuf
// message costs twice a row's bytes, and at a million keys those headers
// were a quarter of the live heap. For the same reason the lock fields,
// which few keys ever use, sit behind a pointer: a row is a 48-byte
// allocation, not 64.
type row struct {
	CreateIndex, ModifyIndex, Flags uint64
	value                           valuefile.Ref
	lock                            *lockState // nil: never acquired
}

// lockState is a key's lock fields: Consul's LockIndex (how many times a
// session acquired the key) and the session holding it ("" once
// released; LockIndex stays). Rows share it and never edit it.
type lockState struct {
	index   uint64
	session string
}

// lockIndex is the row's LockIndex.
func (r *row) lockIndex() uint64 {
	if r.lock == nil {
		return 0
	}
	return r.lock.index
}

// session is the id of the session holding the row's key, "" if none.
func (r *row) session() string {
	if r.lock == nil {
		return ""
	}
	return r.lock.session
}

func lessItem(a, b item) bool { return a.k < b.k }

func newTree() *btree.BTreeG[item] {
	return btree.NewG(btreeDegree, lessItem)
}

// New returns an empty store at index 0 whose values are held in process
// memory (valuefile.Memory).
func New() *Store { return NewWithValues(valuefile.Memory()) }

// NewWithValues returns an empty store at index 0 that keeps its values
// in v. The store owns v from now on but does not close it: the caller
// closes it once nothing reads the store or a Snapshot of it.
func NewWithValues(v *valuefile.File) *Store {
	s := &Store{kv: newTree(), values: v, members: map[uint64]*lodestonepb.Member{}, tab: newTables(), der: newDerived()}
	s.acls.Store(newACLState())
	return s
}

// ValueStats says what the store's value file holds, for metrics.
func (s *Store) ValueStats() valuefile.Stats { return s.values.Stats() }

// ClusterID is the id of the cluster this state belongs to; zero when
// it is not known yet.
func (s *Store) ClusterID() clusterid.ID {
	if p := s.cluster.Load(); p != nil {
		return *p
	}
	return clusterid.ID{}
}

// SetClusterID records the id of the cluster this state belongs to;
// snapshots taken from now on carry it. Any goroutine may call it.
func (s *Store) SetClusterID(id clusterid.ID) { s.cluster.Store(&id) }

// Index returns the last applied Raft index (by Apply, Advance, member
// changes or Restore).
func (s *Store) Index() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.index
}

// KVIndex returns the index of the last command that changed at least one
// key (0 if none). A blocking query on a range can wait for it to pass its
// wait index; it is coarse (any key), finer indices come with the watch hub.
func (s *Store) KVIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.kvIndex
}

// MembersIndex returns the index of the last membership change (0 if none).
func (s *Store) MembersIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.membersIndex
}

// Len returns the number of keys.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.kv.Len()
}

// Advance moves the applied index to index for a Raft entry with no KV
// effect (an empty entry after an election, a conf change without member
// data). An index not above Index() is ignored.
func (s *Store) Advance(index uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if index > s.index {
		s.index = index
	}
}

// Get returns the entry for key, or nil, and the applied index the read was
// made at. The entry is the caller's, but its key bytes are shared with
// the store: callers must not modify them. Key validation is the caller's
// (Limits.ValidateKey).
func (s *Store) Get(key []byte) (*lodestonepb.KeyValue, uint64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.lookup(key), s.index
}

// GetMany reads keys at one index; a nil key is skipped, and its entry,
// as a missing key's, is nil.
func (s *Store) GetMany(keys [][]byte) ([]*lodestonepb.KeyValue, uint64) {
	kvs := make([]*lodestonepb.KeyValue, len(keys))
	s.mu.RLock()
	defer s.mu.RUnlock()
	for i, key := range keys {
		if key != nil {
			kvs[i] = s.lookup(key)
		}
	}
	return kvs, s.index
}

// lookup returns key's entry, nil if there is none. The caller holds mu.
func (s *Store) lookup(key []byte) *lodestonepb.KeyValue {
	it, _ := s.kv.Get(probe(key))
	return s.entry(it.key(), it.r)
}

// entry returns key's entry with its value read from the value file; nil
// for a nil row. The caller holds mu (either way) or a pin.
func (s *Store) entry(key []byte, r *row) *lodestonepb.KeyValue {
	return s.entryWith(key, r, s.values.Read)
}

// prevEntry is entry for a write's previous entry, read once
// (valuefile's ReadOnce).
func (s *Store) prevEntry(key []byte, r *row) *lodestonepb.KeyValue {
	return s.entryWith(key, r, s.values.ReadOnce)
}

func (s *Store) entryWith(key []byte, r *row, read func(valuefile.Ref) ([]byte, error)) *lodestonepb.KeyValue {
	kv := meta(key, r)
	if kv != nil && r.value.Len() > 0 {
		kv.Value = mustRead(read, r.value)
	}
	return kv
}

// mustRead reads ref with read. NB: it panics on an error: the value file
// is the process's own, in the page cache, so a failed read is a failed
// disk, and a member with a failed disk stops, as it does when its log
// cannot be written; its state is rebuilt from the snapshot and the log
// when it starts again (valuefile's doc).
func mustRead(read func(valuefile.Ref) ([]byte, error), ref valuefile.Ref) []byte {
	b, err := read(ref)
	if err != nil {
		panic(fmt.Sprintf("store: %v", err))
	}
	return b
}

// putValue stores v in the value file; it panics on an error, as
// mustRead does, since a replica that could not keep a value would
// diverge from the others.
func (s *Store) putValue(v []byte) valuefile.Ref {
	ref, err := s.values.Put(v)
	if err != nil {
		panic(fmt.Sprintf("store: %v", err))
	}
	return ref
}

// Range returns, in key order, the entries whose key starts with prefix
// (empty prefix: every key) and sorts strictly after startAfter (empty: no
// lower bound), at most limit of them (limit <= 0: no cap; servers pass
// Limits.RangeLimit). more is true when further matching keys exist after
// the last one returned: page on with startAfter = last key. index is the
// applied index the read was made at.
//
// With keysOnly the entries carry no Value. Key bytes are shared with the
// store (see Get). The store's read lock is held while the answer is
// collected, which delays Apply by at most the time to walk limit keys.
func (s *Store) Range(prefix, startAfter []byte, limit int, keysOnly bool) (kvs []*lodestonepb.KeyValue, more bool, index uint64) {
	start := prefix
	skipEqual := false
	if bytes.Compare(startAfter, prefix) >= 0 && len(startAfter) > 0 {
		start, skipEqual = startAfter, true
	}
	if limit > 0 && limit <= 1024 {
		kvs = make([]*lodestonepb.KeyValue, 0, limit)
	}
	var refs []valuefile.Ref
	s.mu.RLock()
	defer s.mu.RUnlock()
	s.kv.AscendGreaterOrEqual(probe(start), func(it item) bool {
		if !bytes.HasPrefix(it.key(), prefix) {
			return false
		}
		if skipEqual && bytes.Equal(it.key(), startAfter) {
			return true
		}
		if limit > 0 && len(kvs) == limit {
			more = true
			return false
		}
		kvs = append(kvs, meta(it.key(), it.r))
		if !keysOnly {
			refs = append(refs, it.r.value)
		}
		return true
	})
	if len(refs) > 0 {
		vals, err := s.values.ReadEach(refs)
		if err != nil {
			panic(fmt.Sprintf("store: %v", err)) // NB: see mustRead
		}
		for i, v := range vals {
			if len(v) > 0 {
				kvs[i].Value = v
			}
		}
	}
	return kvs, more, s.index
}

// meta returns key's entry without its value, nil for a nil row. Key
// bytes are shared (they are immutable).
func meta(key []byte, r *row) *lodestonepb.KeyValue {
	if r == nil {
		return nil
	}
	return &lodestonepb.KeyValue{
		Key:         key,
		CreateIndex: r.CreateIndex,
		ModifyIndex: r.ModifyIndex,
		LockIndex:   r.lockIndex(),
		Flags:       r.Flags,
		Session:     r.session(),
	}
}

// SetMember records (adds or replaces, by id) member m as of the conf change
// applied at index, and moves the applied index to index. index may EQUAL
// Index() so that one conf-change entry can carry several member changes;
// an index below Index() is a replay and is ignored. A nil member or id 0
// changes nothing but the index. The store keeps its own copy of m.
func (s *Store) SetMember(index uint64, m *lodestonepb.Member) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if index < s.index {
		return
	}
	s.index = index
	if m == nil || m.Id == 0 {
		return
	}
	s.members[m.Id] = proto.CloneOf(m)
	s.membersIndex = index
}

// RemoveMember forgets member id as of the conf change applied at index and
// moves the applied index to index. Index rules as SetMember. Removing an
// unknown id changes nothing but the index.
func (s *Store) RemoveMember(index uint64, id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if index < s.index {
		return
	}
	s.index = index
	if _, ok := s.members[id]; ok {
		delete(s.members, id)
		s.membersIndex = index
	}
}

// ApplyConfChange records in the member table the membership changes of
// the conf-change entry at index, and moves the applied index to index. The
// server calls it for every conf-change entry, beside (not instead of) the
// Raft node's own ApplyConfChange: changes are the entry's decoded changes
// (a ConfChange's AsV2().Changes) and member the ConfChangeContext's member
// (may be nil).
//
// For each change, in order:
//   - ConfChangeAddNode, ConfChangeAddLearnerNode: the member is member
//     when its id is the change's node id, else the member as recorded
//     before this entry (so a promotion or demotion keeps names and
//     addresses), else a placeholder with only the id and, as name, the id
//     in hex. Learner is set by the change type, and a voter's
//     AutoPromote is cleared. It is stored as SetMember
//     would (MembersIndex moves).
//   - ConfChangeRemoveNode: the member is forgotten as RemoveMember would
//     (MembersIndex moves if it was known).
//   - ConfChangeUpdateNode changes nothing; a change with node id 0 is
//     skipped, as Raft skips it.
//
// added and removed are the entry's net effect, for the caller to connect
// to and drop peers: each id the entry adds or removes appears in exactly
// one of them, by its last change in the entry, in the order the ids first
// appear, so the caller may handle removed and added in either order. An
// id is reported removed even if no member had it (the caller still drops
// its connection). added holds the stored members, shared with the store:
// callers must not modify them.
//
// Index rules as SetMember: index may equal Index() (an entry may be fed
// again); below it the call is a replay and changes and returns nothing.
// changes and member are not retained.
func (s *Store) ApplyConfChange(index uint64, changes []raftpb.ConfChangeSingle, member *lodestonepb.Member) (added []*lodestonepb.Member, removed []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if index < s.index {
		return nil, nil
	}
	s.index = index
	// NB: an add looks members up as they were before this entry, not as
	// an earlier change of the same entry left them (what the server did
	// before the store owned this).
	before := s.members
	if len(changes) > 1 {
		before = maps.Clone(s.members)
	}
	var (
		ids  []uint64                           // touched, in order of first change
		last = map[uint64]*lodestonepb.Member{} // id -> member added last, nil: removed last
	)
	for _, ch := range changes {
		if ch.NodeID == 0 {
			continue
		}
		switch ch.Type {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			var m *lodestonepb.Member
			if cur, ok := before[ch.NodeID]; member != nil && member.Id == ch.NodeID {
				m = proto.CloneOf(member)
			} else if ok {
				m = proto.CloneOf(cur)
			} else {
				m = &lodestonepb.Member{Id: ch.NodeID, Name: fmt.Sprintf("%x", ch.NodeID)}
			}
			m.Learner = ch.Type == raftpb.ConfChangeAddLearnerNode
			if !m.Learner {
				m.AutoPromote = false // NB: only a learner awaits promotion
			}
			s.members[m.Id] = m
			s.membersIndex = index
			if _, seen := last[m.Id]; !seen {
				ids = append(ids, m.Id)
			}
			last[m.Id] = m
		case raftpb.ConfChangeRemoveNode:
			if _, ok := s.members[ch.NodeID]; ok {
				delete(s.members, ch.NodeID)
				s.membersIndex = index
			}
			if _, seen := last[ch.NodeID]; !seen {
				ids = append(ids, ch.NodeID)
			}
			last[ch.NodeID] = nil
		}
	}
	for _, id := range ids {
		if m := last[id]; m != nil {
			added = append(added, m)
		} else {
			removed = append(removed, id)
		}
	}
	return added, removed
}

// setMemberAttrs applies a member command: it records the client addresses
// (grpc_addr, http_addr) a member publishes about itself. Every other field
// is ignored: voting rights and peer addresses change only by conf change.
// An unknown member changes nothing but the applied index (its command
// may have been overtaken by its removal).
func (a *applier) setMemberAttrs(m *lodestonepb.Member) *lodestonepb.CommandResult {
	if m == nil {
		return &lodestonepb.CommandResult{} // malformed: CheckCommand refuses it
	}
	if cur, ok := a.s.members[m.Id]; ok {
		upd := proto.CloneOf(cur)
		upd.GrpcAddr, upd.HttpAddr = m.GrpcAddr, m.HttpAddr
		a.s.members[m.Id] = upd
		a.s.membersIndex = a.index
	}
	return &lodestonepb.CommandResult{}
}

// Members returns copies of the known members sorted by id; callers own
// them.
func (s *Store) Members() []*lodestonepb.Member {
	s.mu.RLock()
	ms := sortedMembers(s.members)
	s.mu.RUnlock()
	for i, m := range ms {
		ms[i] = proto.CloneOf(m)
	}
	return ms
}

// PeerAddr returns member id's peer address, "" if the member is unknown.
// Unlike Members it copies nothing: every Consul-API answer names the
// leader by it.
func (s *Store) PeerAddr(id uint64) string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if m, ok := s.members[id]; ok {
		return m.PeerAddr
	}
	return ""
}

// sortedMembers returns the (shared) member pointers sorted by id.
func sortedMembers(m map[uint64]*lodestonepb.Member) []*lodestonepb.Member {
	ms := make([]*lodestonepb.Member, 0, len(m))
	for _, x := range m {
		ms = append(ms, x)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Id < ms[j].Id })
	return ms
}
