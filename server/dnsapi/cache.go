package dnsapi

import (
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/miekg/dns"

	"github.com/lodestone-kv/lodestone/acl"
)

// Service answers are kept packed: building and packing the records of a
// 10-instance answer cost several times what reading the question and
// writing the answer do. Each kept answer holds a few variants, packed
// from different orders of its instances, and a query gets one at random
// with its own id; the instance each variant names first differs, so that
// while a service has at most maxVariants instances each comes first
// equally often. A kept answer is used only while its service's view
// (store.ServiceIndex) and the DNS token's Authorizer (the ACL index) are
// those it was built from, and at most variantUses times per variant, after
// which it is built again with new orders. The first answer to a question
// is one variant; the next build, if it is asked again, makes them all.

const (
	maxVariants = 16
	variantUses = 32
	// maxCacheBytes bounds the packed answers kept; past it they are all
	// dropped and built again as asked.
	maxCacheBytes = 8 << 20
)

// answerKey is a question as asked: its name in the case it came in (the
// answer echoes it), type, class, EDNS0 buffer size (0: none) and
// transport.
type answerKey struct {
	name   string
	qtype  uint16
	qclass uint16
	size   uint16
	tcp    bool
}

type packedAnswer struct {
	service  string // lowercase, for the view
	view     *serviceView
	authz    *acl.Authorizer
	variants [][]byte // with the id of the question they were built for
	uses     atomic.Int64
	bytes    int
}

type answerCache struct {
	mu    sync.RWMutex
	m     map[answerKey]*packedAnswer
	bytes int
}

func (c *answerCache) get(k answerKey) *packedAnswer {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.m[k]
}

func (c *answerCache) put(k answerKey, e *packedAnswer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[k]; old != nil {
		c.bytes -= old.bytes
	}
	if c.m == nil || c.bytes+e.bytes > maxCacheBytes {
		c.m, c.bytes = map[answerKey]*packedAnswer{}, 0
	}
	c.m[k] = e
	c.bytes += e.bytes
}

// cacheable says whether answers of qtype are kept: the address and SRV
// questions that carry the load.
func cacheable(qtype uint16) bool {
	return qtype == dns.TypeA || qtype == dns.TypeAAAA || qtype == dns.TypeSRV
}

func keyOf(req *dns.Msg, tcp bool) answerKey {
	q := req.Question[0]
	k := answerKey{name: q.Name, qtype: q.Qtype, qclass: q.Qclass, tcp: tcp}
	if edns := req.IsEdns0(); edns != nil {
		k.size = edns.UDPSize()
	}
	return k
}

// fromCache is the answer to req from a kept one, or nil.
func (s *Server) fromCache(req *dns.Msg, tcp bool) *[]byte {
	if len(req.Question) != 1 || !cacheable(req.Question[0].Qtype) {
		return nil
	}
	e := s.cache.get(keyOf(req, tcp))
	if e == nil || e.uses.Add(-1) < 0 {
		return nil
	}
	if authz, err := s.authorizer(); err != nil || authz != e.authz || s.views.get(e.service) != e.view {
		return nil
	}
	return withID(req, e.variants[rand.IntN(len(e.variants))])
}

// packService answers a service question with a packed answer, and keeps
// the answer's variants for the questions like it that follow.
func (s *Server) packService(req *dns.Msg, p question, tcp bool) (*[]byte, error) {
	authz, err := s.authorizer()
	if err != nil {
		return nil, err
	}
	v, insts, err := s.lookupService(p.service, p.tag)
	if err != nil {
		return nil, err
	}
	n := len(insts)
	base := make([]*instance, n)
	copy(base, insts)
	rand.Shuffle(n, func(i, j int) { base[i], base[j] = base[j], base[i] })
	key := keyOf(req, tcp)
	// NB: a question not asked before gets one variant, so that a flood
	// of names asked once (random case, say) costs one answer each; the
	// variants come when it is asked again. A view read for a name in
	// another case (index 0) is never the same twice, so is not kept.
	variants := 1
	if v.index != 0 && s.cache.get(key) != nil {
		variants = min(n, maxVariants)
	}
	e := &packedAnswer{service: p.service, view: v, authz: authz}
	order := make([]*instance, n)
	for i := range variants {
		copy(order, base)
		order[0], order[i] = order[i], order[0]
		rest := order[1:]
		rand.Shuffle(len(rest), func(a, b int) { rest[a], rest[b] = rest[b], rest[a] })
		m := s.reply(req)
		if err := s.fillService(req.Question[0], v, order, m); err != nil {
			return nil, err // NB: errNoData holds for every order
		}
		s.finish(req, m, tcp)
		b, err := m.Pack()
		if err != nil {
			return nil, err
		}
		e.variants = append(e.variants, b)
		e.bytes += len(b)
	}
	e.uses.Store(int64(len(e.variants) * variantUses))
	if v.index != 0 {
		s.cache.put(key, e)
	}
	return withID(req, e.variants[rand.IntN(len(e.variants))]), nil
}

// withID is a copy of packed answer b for req: its id, and the RD and CD
// bits it asked with.
func withID(req *dns.Msg, b []byte) *[]byte {
	out := getBuffer(len(b))
	copy(*out, b)
	binary.BigEndian.PutUint16(*out, req.Id)
	const rd, cd = 1 << 8, 1 << 4
	flags := binary.BigEndian.Uint16((*out)[2:]) &^ (rd | cd)
	if req.RecursionDesired {
		flags |= rd
	}
	if req.CheckingDisabled {
		flags |= cd
	}
	binary.BigEndian.PutUint16((*out)[2:], flags)
	return out
}

// buffers hold packed answers while they are written; one that grew past
// a UDP answer's size is left to the collector.
var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func getBuffer(n int) *[]byte {
	b := buffers.Get().(*[]byte)
	if cap(*b) < n {
		nb := make([]byte, n)
		return &nb
	}
	*b = (*b)[:n]
	return b
}

func putBuffer(b *[]byte) {
	if cap(*b) <= 4096 {
		buffers.Put(b)
	}
}
