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
}

func newBook(endpoints []string) book {
	return book{configured: slices.Clone(endpoints), members: map[uint64]string{}}
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
	add := func(a string) {
		if a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	add(b.leaderAddr())
	for i := range b.configured {
		add(b.configured[(b.cursor+i)%len(b.configured)])
	}
	ids := make([]uint64, 0, len(b.members))
	for id := range b.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		add(b.members[id])
	}
	return out
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

// observeHeader takes the leader from a response header. A header that
// names no leader forgets the known one.
func (b *book) observeHeader(h *lodestonepb.ResponseHeader) {
	if h == nil {
		return
	}
	b.leaderID = h.GetLeaderId()
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
