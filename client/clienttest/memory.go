package clienttest

import (
	"context"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Memory is an in-memory stand-in for a one-node cluster: a KV map with
// Consul's indices, a membership list and a status. Every write takes the
// next index. It is safe for concurrent use.
type Memory struct {
	mu      sync.Mutex
	index   uint64
	kvs     map[string]*lodestonepb.KeyValue
	members []*lodestonepb.Member
	self    uint64 // id of the member that answers
	leader  uint64
	term    uint64
}

// NewMemory returns an empty store whose membership is the one voter self
// (its id is set to 1 if zero), which is also the leader.
func NewMemory(self *lodestonepb.Member) *Memory {
	self = proto.Clone(self).(*lodestonepb.Member)
	if self.Id == 0 {
		self.Id = 1
	}
	return &Memory{
		kvs:     map[string]*lodestonepb.KeyValue{},
		members: []*lodestonepb.Member{self},
		self:    self.Id,
		leader:  self.Id,
		term:    2,
	}
}

// Funcs returns Funcs answering from m.
func (m *Memory) Funcs() *Funcs {
	return &Funcs{
		Get: m.get, GetMany: m.getMany, Range: m.rng, Put: m.put, Delete: m.del, Txn: m.txn,
		Members: m.membersRPC, AddMember: m.addMember, RemoveMember: m.removeMember,
		PromoteMember: m.promote, TransferLeader: m.transfer, Status: m.status,
	}
}

func (m *Memory) header() *lodestonepb.ResponseHeader {
	return &lodestonepb.ResponseHeader{Index: m.index, Term: m.term, LeaderId: m.leader, NodeId: m.self, KnownLeader: m.leader != 0}
}

func (m *Memory) get(_ context.Context, r *lodestonepb.GetRequest) (*lodestonepb.GetResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return &lodestonepb.GetResponse{Header: m.header(), Kv: m.lookup(r.Key)}, nil
}

// getMany answers every key at one index, as the server does.
func (m *Memory) getMany(_ context.Context, r *lodestonepb.GetManyRequest) (*lodestonepb.GetManyResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	resp := &lodestonepb.GetManyResponse{Header: m.header()}
	for _, key := range r.Keys {
		resp.Results = append(resp.Results, &lodestonepb.GetManyResult{Served: true, Kv: m.lookup(key)})
	}
	return resp, nil
}

// lookup returns a copy of key's entry, nil if there is none. The caller
// holds mu.
func (m *Memory) lookup(key []byte) *lodestonepb.KeyValue {
	kv, ok := m.kvs[string(key)]
	if !ok {
		return nil
	}
	return proto.Clone(kv).(*lodestonepb.KeyValue)
}

func (m *Memory) rng(_ context.Context, r *lodestonepb.RangeRequest) (*lodestonepb.RangeResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := make([]string, 0, len(m.kvs))
	for k := range m.kvs {
		if strings.HasPrefix(k, string(r.Prefix)) && (len(r.StartAfter) == 0 || k > string(r.StartAfter)) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	resp := &lodestonepb.RangeResponse{Header: m.header()}
	for _, k := range keys {
		if r.Limit > 0 && len(resp.Kvs) == int(r.Limit) {
			resp.More = true
			break
		}
		kv := proto.Clone(m.kvs[k]).(*lodestonepb.KeyValue)
		if r.KeysOnly {
			kv.Value = nil
		}
		resp.Kvs = append(resp.Kvs, kv)
	}
	return resp, nil
}

// checkCAS reports a FailedPrecondition unless key's ModifyIndex is want
// (0: absent).
func (m *Memory) checkCAS(key string, want uint64) error {
	var have uint64
	if kv, ok := m.kvs[key]; ok {
		have = kv.ModifyIndex
	}
	if have != want {
		return status.Errorf(codes.FailedPrecondition, "cas: key %q has modify index %d, not %d", key, have, want)
	}
	return nil
}

// set stores key at the current index; the caller advanced it.
func (m *Memory) set(key string, value []byte, flags uint64) *lodestonepb.KeyValue {
	kv, ok := m.kvs[key]
	if !ok {
		kv = &lodestonepb.KeyValue{Key: []byte(key), CreateIndex: m.index}
		m.kvs[key] = kv
	}
	kv.Value, kv.Flags, kv.ModifyIndex = append([]byte(nil), value...), flags, m.index
	return kv
}

func (m *Memory) put(_ context.Context, r *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(r.Key) == 0 {
		return nil, status.Error(codes.InvalidArgument, "key must not be empty")
	}
	if r.Cas != nil {
		if err := m.checkCAS(string(r.Key), *r.Cas); err != nil {
			return nil, err
		}
	}
	m.index++
	kv := proto.Clone(m.set(string(r.Key), r.Value, r.Flags)).(*lodestonepb.KeyValue)
	kv.Value = nil
	return &lodestonepb.PutResponse{Header: m.header(), Kv: kv}, nil
}

func (m *Memory) remove(key string, prefix bool) uint64 {
	var n uint64
	for k := range m.kvs {
		if k == key || (prefix && strings.HasPrefix(k, key)) {
			delete(m.kvs, k)
			n++
		}
	}
	return n
}

func (m *Memory) del(_ context.Context, r *lodestonepb.DeleteRequest) (*lodestonepb.DeleteResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.Cas != nil && r.Prefix {
		return nil, status.Error(codes.InvalidArgument, "cas is not allowed with prefix")
	}
	if r.Cas != nil {
		if err := m.checkCAS(string(r.Key), *r.Cas); err != nil {
			return nil, err
		}
	}
	m.index++
	n := m.remove(string(r.Key), r.Prefix)
	return &lodestonepb.DeleteResponse{Header: m.header(), Deleted: n}, nil
}

func (m *Memory) txn(_ context.Context, r *lodestonepb.TxnRequest) (*lodestonepb.TxnResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	resp := &lodestonepb.TxnResponse{Header: m.header()}
	// Checks first: nothing is applied unless all hold.
	for i, op := range r.Ops {
		var err error
		switch op.Verb {
		case lodestonepb.TxnOp_CAS, lodestonepb.TxnOp_CHECK_INDEX, lodestonepb.TxnOp_DELETE_CAS:
			err = m.checkCAS(string(op.Key), op.Index)
		case lodestonepb.TxnOp_CHECK_NOT_EXISTS:
			err = m.checkCAS(string(op.Key), 0)
		case lodestonepb.TxnOp_VERB_UNSPECIFIED:
			return nil, status.Errorf(codes.InvalidArgument, "op %d: verb unspecified", i)
		}
		if err != nil {
			resp.Errors = append(resp.Errors, &lodestonepb.TxnError{OpIndex: uint32(i), What: status.Convert(err).Message()})
		}
	}
	if len(resp.Errors) > 0 {
		return resp, nil
	}
	m.index++
	for _, op := range r.Ops {
		res := &lodestonepb.TxnResult{}
		switch op.Verb {
		case lodestonepb.TxnOp_SET, lodestonepb.TxnOp_CAS:
			res.Kv = proto.Clone(m.set(string(op.Key), op.Value, op.Flags)).(*lodestonepb.KeyValue)
			res.Kv.Value = nil
		case lodestonepb.TxnOp_GET:
			if kv, ok := m.kvs[string(op.Key)]; ok {
				res.Kv = proto.Clone(kv).(*lodestonepb.KeyValue)
			}
		case lodestonepb.TxnOp_DELETE, lodestonepb.TxnOp_DELETE_CAS:
			res.Deleted = m.remove(string(op.Key), false)
		case lodestonepb.TxnOp_DELETE_PREFIX:
			res.Deleted = m.remove(string(op.Key), true)
		}
		resp.Results = append(resp.Results, res)
	}
	resp.Succeeded = true
	resp.Header = m.header()
	return resp, nil
}

func (m *Memory) cloneMembers() []*lodestonepb.Member {
	out := make([]*lodestonepb.Member, len(m.members))
	for i, mb := range m.members {
		out[i] = proto.Clone(mb).(*lodestonepb.Member)
	}
	return out
}

func (m *Memory) find(ref *lodestonepb.MemberRef) (int, error) {
	for i, mb := range m.members {
		if (ref.GetName() != "" && mb.Name == ref.GetName()) || (ref.GetId() != 0 && mb.Id == ref.GetId()) {
			return i, nil
		}
	}
	return -1, status.Errorf(codes.NotFound, "no member %v", ref)
}

func (m *Memory) membersRPC(context.Context, *lodestonepb.MembersRequest) (*lodestonepb.MembersResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return &lodestonepb.MembersResponse{Header: m.header(), Members: m.cloneMembers()}, nil
}

func (m *Memory) addMember(_ context.Context, r *lodestonepb.AddMemberRequest) (*lodestonepb.AddMemberResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.Name == "" || r.PeerAddr == "" {
		return nil, status.Error(codes.InvalidArgument, "name and peer_addr are required")
	}
	if _, err := m.find(&lodestonepb.MemberRef{Name: r.Name}); err == nil {
		return nil, status.Errorf(codes.InvalidArgument, "member %q exists", r.Name)
	}
	if r.Learner && r.VoterNow {
		return nil, status.Error(codes.InvalidArgument, "a member is added either as a learner or as a voter now, not both")
	}
	if r.VoterNow {
		// NB: as the server's probe, but only a TCP dial.
		c, err := net.DialTimeout("tcp", r.PeerAddr, time.Second)
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "refused to add %q as a voter now: its peer address %s does not answer as a member of this cluster (%v)", r.Name, r.PeerAddr, err)
		}
		c.Close()
	}
	// As the server: a learner by default, promoted once caught up (here:
	// never, nothing catches up in memory).
	mb := &lodestonepb.Member{Id: MemberID(r.Name), Name: r.Name, PeerAddr: r.PeerAddr, GrpcAddr: r.GrpcAddr, HttpAddr: r.HttpAddr,
		Learner: !r.VoterNow, AutoPromote: !r.VoterNow && !r.Learner}
	m.members = append(m.members, mb)
	m.index++
	return &lodestonepb.AddMemberResponse{Header: m.header(), Member: proto.Clone(mb).(*lodestonepb.Member), Members: m.cloneMembers()}, nil
}

func (m *Memory) removeMember(_ context.Context, r *lodestonepb.RemoveMemberRequest) (*lodestonepb.RemoveMemberResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, err := m.find(r.Member)
	if err != nil {
		return nil, err
	}
	if victim := m.members[i]; !victim.Learner && !r.Force {
		var left []string
		for _, x := range m.members {
			if !x.Learner && x.Id != victim.Id {
				left = append(left, x.Name)
			}
		}
		if len(left) == 1 {
			return nil, status.Errorf(codes.FailedPrecondition, "refused to remove voter %q: it would leave %s as the only voter, and the cluster would stop at that member's first failure; add a member first, or remove it anyway with force (--force)", victim.Name, left[0])
		}
	}
	m.members = append(m.members[:i], m.members[i+1:]...)
	m.index++
	return &lodestonepb.RemoveMemberResponse{Header: m.header(), Members: m.cloneMembers()}, nil
}

func (m *Memory) promote(_ context.Context, r *lodestonepb.PromoteMemberRequest) (*lodestonepb.PromoteMemberResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, err := m.find(r.Member)
	if err != nil {
		return nil, err
	}
	if !m.members[i].Learner {
		return nil, status.Errorf(codes.FailedPrecondition, "member %q is already a voter", m.members[i].Name)
	}
	m.members[i].Learner, m.members[i].AutoPromote = false, false
	m.index++
	return &lodestonepb.PromoteMemberResponse{Header: m.header(), Members: m.cloneMembers()}, nil
}

func (m *Memory) transfer(_ context.Context, r *lodestonepb.TransferLeaderRequest) (*lodestonepb.TransferLeaderResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	to := m.leader
	if r.To != nil && (r.To.Name != "" || r.To.Id != 0) {
		i, err := m.find(r.To)
		if err != nil {
			return nil, err
		}
		if m.members[i].Learner {
			return nil, status.Errorf(codes.FailedPrecondition, "member %q is a learner", m.members[i].Name)
		}
		to = m.members[i].Id
	} else {
		for _, mb := range m.members {
			if mb.Id != m.leader && !mb.Learner {
				to = mb.Id
				break
			}
		}
	}
	m.leader = to
	m.term++
	return &lodestonepb.TransferLeaderResponse{Header: m.header(), LeaderId: to}, nil
}

func (m *Memory) status(context.Context, *lodestonepb.StatusRequest) (*lodestonepb.StatusResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var self *lodestonepb.Member
	var leaderName string
	for _, mb := range m.members {
		if mb.Id == m.self {
			self = proto.Clone(mb).(*lodestonepb.Member)
		}
		if mb.Id == m.leader {
			leaderName = mb.Name
		}
	}
	state := "StateFollower"
	if m.leader == m.self {
		state = "StateLeader"
	}
	return &lodestonepb.StatusResponse{
		Header: m.header(), Self: self, LeaderId: m.leader, LeaderName: leaderName,
		Term: m.term, CommitIndex: m.index, AppliedIndex: m.index, RaftState: state,
		Log: &lodestonepb.LogStats{
			FirstIndex: 1, LastIndex: m.index, FileBytes: 32768, FreePages: 2,
			FreeBytes: 8192, FreelistBytes: 16, SnapshotIndex: 0,
		},
		Version: "clienttest",
	}, nil
}

// MemberID derives a member id from its name the way the server does
// (FNV-64a, never 0).
func MemberID(name string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= prime
	}
	if h == 0 {
		h = 1
	}
	return h
}
