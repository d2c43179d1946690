package client

import (
	"net"
	"net/netip"
	"slices"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// book is the client's view of where to send requests: the configured
// endpoints, which of them answered last, the leader's id and the members'
// gRPC addresses. It is a plain state machine (no locks, no I/O); Client
// guards it with its mutex.
type book struct {
	configured []string
	cursor     int               // index in configured of the preferred endpoint
	leaderID   uint64            // 0: unknown
	members    map[uint64]string // member id → gRPC address, from the latest membership answer
	answeredBy map[string]uint64 // endpoint → id of the member that answered there (response headers)
}

func newBook(endpoints []string) book {
	return book{configured: slices.Clone(endpoints), members: map[uint64]string{}, answeredBy: map[string]uint64{}}
}

// leaderAddr returns the leader's gRPC address, "" if the leader or its
// address is unknown.
func (b *book) leaderAddr() string {
	if b.leaderID == 0 {
		return ""
	}
	return b.members[b.leaderID]
}

// plan returns every endpoint once, in the order to try them: the leader,
// the configured endpoints from the cursor on, then the other members'
// addresses sorted by id.
func (b *book) plan() []string {
	out := make([]string, 0, len(b.configured)+len(b.members)+1)
	out = addNew(out, b.leaderAddr())
	out = b.addRest(out)
	for _, a := range b.memberAddrs() {
		out = addNew(out, a)
	}
	return out
}

// followerPlan is the order watch streams try endpoints in: first the
// followers a quorum can do without, then the other followers, the
// configured endpoints, and last the leader's endpoints.
//
// With n known members a write commits once the leader has ⌊n/2⌋
// followers' acknowledgements, so n-1-⌊n/2⌋ followers (at least one) can
// carry the watch fan-out while enough others stay free of it to keep
// commits fast: all clients pick the same ones, the lowest member ids,
// starting from the one at spread (modulo their number) so that clients
// share them. An endpoint is the leader's if the membership gives it as
// the leader's address or if the leader answered there: a member that has
// not yet published its address is still recognized.
func (b *book) followerPlan(spread int) []string {
	var followers []string
	for _, a := range b.memberAddrs() {
		if !b.isLeader(a) {
			followers = append(followers, a)
		}
	}
	n := len(b.members)
	k := min(len(followers), max(1, n-1-n/2))
	order := make([]string, 0, k+len(followers)+len(b.configured)+1)
	for i := range k {
		order = append(order, followers[(spread+i)%k])
	}
	order = append(append(order, followers...), b.addRest(nil)...)
	order = append(order, b.leaderAddr())
	// Everything but the leader's endpoints, then those.
	out := make([]string, 0, len(order))
	for _, last := range []bool{false, true} {
		for _, a := range order {
			if b.isLeader(a) == last {
				out = addNew(out, a)
			}
		}
	}
	return out
}

// isLeader reports whether ep is known to reach the leader.
func (b *book) isLeader(ep string) bool {
	if b.leaderID == 0 {
		return false
	}
	return b.members[b.leaderID] == ep || b.answeredBy[ep] == b.leaderID
}

// addRest appends the configured endpoints from the cursor on.
func (b *book) addRest(out []string) []string {
	for i := range b.configured {
		out = addNew(out, b.configured[(b.cursor+i)%len(b.configured)])
	}
	return out
}

// memberAddrs returns the known members' addresses sorted by member id.
func (b *book) memberAddrs() []string {
	ids := make([]uint64, 0, len(b.members))
	for id := range b.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = b.members[id]
	}
	return out
}

// addNew appends a to out unless it is empty or already there.
func addNew(out []string, a string) []string {
	if a == "" || slices.Contains(out, a) {
		return out
	}
	return append(out, a)
}

// failed records that ep could not serve a request: the call moves on, and
// the next call does not start there.
func (b *book) failed(ep string) {
	if ep == b.leaderAddr() {
		b.leaderID = 0
	}
	if len(b.configured) > 0 && b.configured[b.cursor] == ep {
		b.cursor = (b.cursor + 1) % len(b.configured)
	}
}

// succeeded records that ep answered: later calls start there (when no
// leader address is known).
func (b *book) succeeded(ep string) {
	if i := slices.Index(b.configured, ep); i >= 0 {
		b.cursor = i
	}
}

// observeHeader takes the leader from a response header that came from
// ep, and which member answered there. A header that names no leader
// forgets the known one.
func (b *book) observeHeader(ep string, h *lodestonepb.ResponseHeader) {
	if h == nil {
		return
	}
	b.leaderID = h.GetLeaderId()
	if id := h.GetNodeId(); id != 0 && ep != "" {
		b.answeredBy[ep] = id
	}
}

// observeMembers replaces the address book with a full membership list.
func (b *book) observeMembers(ms []*lodestonepb.Member) {
	b.members = make(map[uint64]string, len(ms))
	for _, m := range ms {
		b.observeMember(m)
	}
}

// observeMember adds or updates one member's address.
func (b *book) observeMember(m *lodestonepb.Member) {
	if m.GetId() == 0 || !dialable(m.GetGrpcAddr()) {
		return
	}
	b.members[m.GetId()] = m.GetGrpcAddr()
}

// dialable reports whether addr names a host another machine can dial:
// NB: a member that advertises its listen address (":7400", "0.0.0.0:7400")
// would send the client to whatever listens on its own host.
func dialable(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
		return false
	}
	return true
}
