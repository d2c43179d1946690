package acl

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeSource is an in-memory Source whose index moves on every change.
type fakeSource struct {
	mu       sync.Mutex
	index    atomic.Uint64
	tokens   map[string]*Token
	policies map[string]*Policy
	roles    map[string]*Role
	lookups  atomic.Int64
}

func newFakeSource() *fakeSource {
	s := &fakeSource{tokens: map[string]*Token{}, policies: map[string]*Policy{}, roles: map[string]*Role{}}
	s.tokens[AnonymousTokenSecret] = AnonymousToken()
	return s
}

func (s *fakeSource) ACLIndex() uint64 { return s.index.Load() }
func (s *fakeSource) TokenBySecret(secret string) (*Token, bool) {
	s.lookups.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tokens[secret]
	return t, ok
}
func (s *fakeSource) Policy(id string) (*Policy, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.policies[id]
	return p, ok
}
func (s *fakeSource) Role(id string) (*Role, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.roles[id]
	return r, ok
}

func (s *fakeSource) change(fn func()) {
	s.mu.Lock()
	fn()
	s.mu.Unlock()
	s.index.Add(1)
}

func TestResolver(t *testing.T) {
	src := newFakeSource()
	src.change(func() {
		src.policies["p1"] = &Policy{Id: "p1", Name: "kv", Rules: `key_prefix "app/" { policy = "write" }`}
		src.policies["p2"] = &Policy{Id: "p2", Name: "svc", Rules: `service_prefix "" { policy = "read" }`}
		src.roles["r1"] = &Role{Id: "r1", Name: "reader", Policies: []*Link{{Id: "p2"}}}
		src.tokens["s1"] = &Token{AccessorId: "a1", SecretId: "s1", Policies: []*Link{{Id: "p1"}}, Roles: []*Link{{Id: "r1"}}}
		src.tokens["mgmt"] = &Token{AccessorId: "am", SecretId: "mgmt", Roles: []*Link{{Id: "rm"}}}
		src.roles["rm"] = &Role{Id: "rm", Name: "admins", Policies: []*Link{{Id: GlobalManagementPolicyID}}}
	})
	r := NewResolver(src, Config{Enabled: true})

	a, err := r.Resolve("s1")
	if err != nil {
		t.Fatal(err)
	}
	if a.AccessorID() != "a1" || !a.Allowed(ResourceKey, "app/x", AccessWrite) || !a.Allowed(ResourceService, "web", AccessRead) {
		t.Error("token does not carry its policy's and its role's rights")
	}
	if a.Allowed(ResourceKey, "other", AccessRead) || a.Allowed(ResourceACL, "", AccessRead) {
		t.Error("default deny not applied")
	}
	if m, _ := r.Resolve("mgmt"); !m.Allowed(ResourceACL, "", AccessWrite) || m.AccessorID() != "am" {
		t.Error("a role linking global-management must grant everything")
	}
	if _, err := r.Resolve("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown secret: %v, want ErrNotFound", err)
	}
	anon, err := r.Resolve("")
	if err != nil || anon.AccessorID() != AnonymousTokenID || anon.Allowed(ResourceKey, "x", AccessRead) {
		t.Errorf("anonymous: %v %v", anon, err)
	}

	// A hit does not touch the source; a change drops the cache.
	before := src.lookups.Load()
	if b, _ := r.Resolve("s1"); b != a {
		t.Error("second resolve was not served from the cache")
	}
	if src.lookups.Load() != before {
		t.Error("cache hit read the source")
	}
	src.change(func() {
		src.policies["p1"] = &Policy{Id: "p1", Name: "kv", Rules: `key_prefix "app/" { policy = "read" }`}
	})
	b, _ := r.Resolve("s1")
	if b == a || b.Allowed(ResourceKey, "app/x", AccessWrite) {
		t.Error("policy change not seen after the index moved")
	}
	// A deleted policy's link is dropped.
	src.change(func() { delete(src.policies, "p1") })
	if c, _ := r.Resolve("s1"); c.Allowed(ResourceKey, "app/x", AccessRead) {
		t.Error("deleted policy still grants")
	}
	// A deleted token stops resolving.
	src.change(func() { delete(src.tokens, "s1") })
	if _, err := r.Resolve("s1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted token: %v", err)
	}
}

func TestResolverDisabledAndDefaultAllow(t *testing.T) {
	src := newFakeSource()
	off := NewResolver(src, Config{})
	if a, err := off.Resolve("anything"); err != nil || !a.Allowed(ResourceACL, "", AccessWrite) || off.Enabled() {
		t.Errorf("disabled: %v %v", a, err)
	}
	allow := NewResolver(src, Config{Enabled: true, DefaultPolicy: AccessWrite})
	a, err := allow.Resolve("")
	if err != nil || !a.Allowed(ResourceKey, "x", AccessWrite) || a.Allowed(ResourceACL, "", AccessRead) {
		t.Errorf("default allow anonymous: %v %v", a, err)
	}
}

func TestResolverCacheBounded(t *testing.T) {
	src := newFakeSource()
	src.change(func() {
		for i := range maxCachedAuthorizers + 10 {
			s := string(rune('a'+i%26)) + string(rune(i))
			src.tokens[s] = &Token{AccessorId: s, SecretId: s}
		}
	})
	r := NewResolver(src, Config{Enabled: true})
	for s := range src.tokens {
		if _, err := r.Resolve(s); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(r.cache); n > maxCachedAuthorizers {
		t.Errorf("cache holds %d, bound %d", n, maxCachedAuthorizers)
	}
}

func TestResolveHitAllocatesNothing(t *testing.T) {
	src := newFakeSource()
	src.change(func() { src.tokens["s"] = &Token{AccessorId: "a", SecretId: "s"} })
	r := NewResolver(src, Config{Enabled: true})
	if _, err := r.Resolve("s"); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = r.Resolve("s") }); n != 0 {
		t.Errorf("Resolve hit allocates %v times", n)
	}
}

func BenchmarkResolveHit(b *testing.B) {
	src := newFakeSource()
	src.change(func() {
		src.policies["p"] = &Policy{Id: "p", Rules: `key_prefix "app/" { policy = "write" }`}
		src.tokens["s"] = &Token{AccessorId: "a", SecretId: "s", Policies: []*Link{{Id: "p"}}}
	})
	r := NewResolver(src, Config{Enabled: true})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			a, err := r.Resolve("s")
			if err != nil || !a.Allowed(ResourceKey, "app/x", AccessWrite) {
				b.Fatal("resolve")
			}
		}
	})
}
