package acl

import (
	"sync"
)

// Config is how a server enforces ACLs.
type Config struct {
	// Enabled: false resolves every secret to AllowAll.
	Enabled bool
	// DefaultPolicy is what a request gets where no rule matches:
	// AccessWrite ("allow") or AccessDeny ("deny", also the zero value and
	// anything else).
	DefaultPolicy Access
}

// Source is the replicated ACL state; store.Store implements it. Its reads
// are safe concurrently with the store's apply.
type Source interface {
	// ACLIndex moves on every ACL change (it may move back on a snapshot
	// restore: compare for inequality).
	ACLIndex() uint64
	TokenBySecret(secret string) (*Token, bool)
	Policy(id string) (*Policy, bool)
	Role(id string) (*Role, bool)
}

// maxCachedAuthorizers bounds the resolver's cache. Only secrets that
// resolved are cached (a flood of made-up secrets adds nothing), so the
// bound matters only for clusters with more live tokens than this; past it
// a random entry makes room, and a miss costs one compile (a few map
// lookups and a parse per policy), not an error. 4096 compiled
// authorizers of typical size are a few MB at most.
const maxCachedAuthorizers = 4096

// Resolver turns token secrets into Authorizers, caching them until the
// ACL state changes.
type Resolver struct {
	src      Source
	cfg      Config
	disabled *Authorizer // made once: Resolve with ACLs off allocates nothing

	mu    sync.RWMutex
	index uint64                 // Source.ACLIndex the cache was built at
	cache map[string]*Authorizer // by secret
}

// NewResolver returns a Resolver over src.
func NewResolver(src Source, cfg Config) *Resolver {
	if cfg.DefaultPolicy != AccessWrite {
		cfg.DefaultPolicy = AccessDeny
	}
	return &Resolver{src: src, cfg: cfg, disabled: AllowAll(""), cache: map[string]*Authorizer{}}
}

// Enabled reports whether ACLs are enforced.
func (r *Resolver) Enabled() bool { return r.cfg.Enabled }

// Resolve returns the Authorizer of the token with secret ("" is the
// anonymous token). A secret nobody issued is ErrNotFound. With ACLs
// disabled every secret resolves to AllowAll.
//
// A hit costs Source.ACLIndex (one atomic load in the store) and a map
// lookup under a read lock, and allocates nothing. The whole cache is
// dropped when the index moves, so a change to any token, policy or role
// takes effect on the next request.
func (r *Resolver) Resolve(secret string) (*Authorizer, error) {
	if !r.cfg.Enabled {
		return r.disabled, nil
	}
	if secret == "" {
		secret = AnonymousTokenSecret
	}
	// NB: the index is read before the state compile reads, so an entry
	// is never filed under an index newer than the state it was built
	// from; at worst it is built from newer state and dropped early.
	idx := r.src.ACLIndex()
	r.mu.RLock()
	if r.index == idx {
		if a, ok := r.cache[secret]; ok {
			r.mu.RUnlock()
			return a, nil
		}
	}
	r.mu.RUnlock()

	a, err := r.compile(secret)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.index != idx {
		r.index = idx
		r.cache = make(map[string]*Authorizer, len(r.cache))
	}
	if len(r.cache) >= maxCachedAuthorizers {
		for k := range r.cache { // Go's map order makes this a random eviction
			delete(r.cache, k)
			break
		}
	}
	r.cache[secret] = a
	r.mu.Unlock()
	return a, nil
}

// compile builds the Authorizer of one token from the source: its
// policies and its roles' policies. A link to a policy or role that no
// longer exists is skipped (Consul drops links to deleted objects).
func (r *Resolver) compile(secret string) (*Authorizer, error) {
	tok, ok := r.src.TokenBySecret(secret)
	if !ok {
		return nil, ErrNotFound
	}
	ids := make([]string, 0, len(tok.Policies))
	for _, l := range tok.Policies {
		ids = append(ids, l.Id)
	}
	for _, rl := range tok.Roles {
		if role, ok := r.src.Role(rl.Id); ok {
			for _, l := range role.Policies {
				ids = append(ids, l.Id)
			}
		}
	}
	var sets [][]Rule
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		if id == GlobalManagementPolicyID {
			return AllowAll(tok.AccessorId), nil
		}
		p, ok := r.src.Policy(id)
		if !ok {
			continue
		}
		rules, err := ParseRules(p.Rules)
		if err != nil {
			continue // stored rules were checked when written; grant nothing
		}
		sets = append(sets, rules)
	}
	return Compile(tok.AccessorId, sets, r.cfg.DefaultPolicy), nil
}
