package gossip

import (
	"encoding/json"
	"sort"
	"time"
)

// State is a member's liveness as this member sees it.
type State int

// Member states. Memberlist reports no event for suspicion, so a suspected
// member stays Alive until the verdict.
const (
	StateAlive State = iota + 1
	// StateFailed: the member stopped answering probes and did not refute
	// the suspicion (crash, kill -9, partition).
	StateFailed
	// StateLeft: the member announced its departure.
	StateLeft
)

func (s State) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateFailed:
		return "failed"
	case StateLeft:
		return "left"
	}
	return "unknown"
}

// States lists every state, in metric order.
var States = []State{StateAlive, StateFailed, StateLeft}

// Meta is what a member advertises about itself (JSON in memberlist's node
// metadata, far below its 512 byte limit).
type Meta struct {
	Role Role   `json:"role"`
	Name string `json:"name"`
	// Leaving is set in the last update a member gossips before it leaves,
	// so the others can tell a departure from a failure: memberlist's
	// leave callback does not say which it was.
	Leaving bool `json:"leaving,omitempty"`
}

// EncodeMeta returns m's wire form.
func EncodeMeta(m Meta) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic("gossip: encode meta: " + err.Error()) // two strings always encode
	}
	return b
}

// DecodeMeta parses a member's metadata; anything unreadable (an older or
// foreign member) yields an empty Role.
func DecodeMeta(b []byte) Meta {
	var m Meta
	if json.Unmarshal(b, &m) != nil {
		return Meta{}
	}
	return m
}

// Member is one pool member as the Roster sees it.
type Member struct {
	Name string
	// Addr is the member's gossip host:port.
	Addr  string
	Role  Role
	State State
	// Since is when this member entered State, by the Roster's clock.
	Since time.Time
	// Leaving: the member announced it is about to leave.
	Leaving bool
}

// Roster is one member's view of the pool: each member's last known
// address, role and state. Plain methods, no locking; the Pool serializes
// calls.
type Roster struct {
	forgetAfter time.Duration
	members     map[string]*Member
}

// NewRoster returns an empty Roster that forgets failed and left members
// forgetAfter after they went.
func NewRoster(forgetAfter time.Duration) *Roster {
	return &Roster{forgetAfter: forgetAfter, members: map[string]*Member{}}
}

// Alive records that name is alive at addr with meta (a join or a metadata
// update). It reports whether anything the reconciler reads changed.
func (r *Roster) Alive(name, addr string, meta Meta, now time.Time) bool {
	m, ok := r.members[name]
	if !ok {
		r.members[name] = &Member{Name: name, Addr: addr, Role: meta.Role, State: StateAlive, Since: now, Leaving: meta.Leaving}
		return true
	}
	changed := m.State != StateAlive || m.Addr != addr || m.Role != meta.Role
	if m.State != StateAlive {
		m.State, m.Since = StateAlive, now
	}
	m.Addr, m.Role, m.Leaving = addr, meta.Role, meta.Leaving
	return changed
}

// Gone records that name stopped being alive: it left if its metadata
// (meta, or the last update recorded) announced it was leaving, else it
// failed. Unknown names are recorded too: a member may die before this one
// heard of it alive, and the reconciler must still learn of it.
func (r *Roster) Gone(name, addr string, meta Meta, now time.Time) bool {
	m, ok := r.members[name]
	st := StateFailed
	if meta.Leaving || (ok && m.Leaving) {
		st = StateLeft
	}
	if !ok {
		r.members[name] = &Member{Name: name, Addr: addr, Role: meta.Role, State: st, Since: now}
		return true
	}
	if m.State == st {
		return false
	}
	m.State, m.Since = st, now
	if meta.Role != "" {
		m.Role = meta.Role
	}
	return true
}

// Forget drops failed and left members that went at least forgetAfter
// before now, and returns their names.
func (r *Roster) Forget(now time.Time) []string {
	var out []string
	for name, m := range r.members {
		if (m.State == StateFailed || m.State == StateLeft) && now.Sub(m.Since) >= r.forgetAfter {
			delete(r.members, name)
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Members returns a copy of every member, sorted by name.
func (r *Roster) Members() []Member {
	out := make([]Member, 0, len(r.members))
	for _, m := range r.members {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Get returns one member.
func (r *Roster) Get(name string) (Member, bool) {
	m, ok := r.members[name]
	if !ok {
		return Member{}, false
	}
	return *m, true
}
