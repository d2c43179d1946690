package dnsapi

import (
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

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
// The UDP fast path (fastpath.go) answers from the same kept answers.

const (
	maxVariants = 16
	variantUses = 32
)

// The key of a kept answer is the question as asked, in one string so
// that the UDP fast path looks it up from a datagram's bytes without
// allocating: the name in the case it came in (the answer echoes it, and
// miekg/dns compresses names case-sensitively, so an answer packed for
// one case differs from another's beyond the question), then type,
// class, whether EDNS0 came and its buffer size, and the transport.
// Nothing else of a question changes its answer but the id and the RD
// and CD bits, which withID sets; the DO bit does not (answers carry no
// DNSSEC records, and their OPT never sets it).

// appendKeyTail appends what follows the name in a key.
func appendKeyTail(b []byte, qtype, qclass uint16, edns bool, size uint16, tcp bool) []byte {
	b = append(b, 0)
	b = binary.BigEndian.AppendUint16(b, qtype)
	b = binary.BigEndian.AppendUint16(b, qclass)
	b = binary.BigEndian.AppendUint16(b, size)
	var flags byte
	if edns {
		flags |= 1
	}
	if tcp {
		flags |= 2
	}
	return append(b, flags)
}

type packedAnswer struct {
	service  string // lowercase, for the view
	view     *serviceView
	authz    *acl.Authorizer
	variants [][]byte // with the id of the question they were built for
	// shufflers are the variants' (shuffle.go), nil for one that is
	// copied as it is; with every variant shuffled, the uses never run
	// out (shuffled).
	shufflers []*shuffler
	shuffled  bool
	uses      atomic.Int64
	bytes     int
}

// answerCache holds packed answers up to max bytes (Config.AnswerCacheBytes).
type answerCache struct {
	max     int
	flushed prometheus.Counter

	mu    sync.RWMutex
	m     map[string]*packedAnswer
	bytes int
}

func (c *answerCache) get(k string) *packedAnswer {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.m[k]
}

// getBytes is get for a key in a buffer; it does not allocate.
func (c *answerCache) getBytes(k []byte) *packedAnswer {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.m[string(k)]
}

func (c *answerCache) put(k string, e *packedAnswer) {
	if e.bytes > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[k]; old != nil {
		c.bytes -= old.bytes
	}
	if c.m == nil || c.bytes+e.bytes > c.max {
		if c.m != nil {
			c.flushed.Inc()
		}
		c.m, c.bytes = map[string]*packedAnswer{}, 0
	}
	c.m[k] = e
	c.bytes += e.bytes
}

// size is the bytes of the answers kept.
func (c *answerCache) size() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.bytes
}

// cacheable says whether answers of qtype are kept: the address and SRV
// questions that carry the load.
func cacheable(qtype uint16) bool {
	return qtype == dns.TypeA || qtype == dns.TypeAAAA || qtype == dns.TypeSRV
}

func keyOf(req *dns.Msg, tcp bool) string {
	q := req.Question[0]
	var size uint16
	edns := req.IsEdns0()
	if edns != nil {
		size = edns.UDPSize()
	}
	return string(appendKeyTail([]byte(q.Name), q.Qtype, q.Qclass, edns != nil, size, tcp))
}

// fromCache is the answer to req from a kept one, or nil.
func (s *Server) fromCache(req *dns.Msg, tcp bool) *[]byte {
	if len(req.Question) != 1 || !cacheable(req.Question[0].Qtype) {
		return nil
	}
	b, sh := s.variant(s.cache.get(keyOf(req, tcp)))
	if b == nil {
		return nil
	}
	return withID(req, b, sh)
}

// variant is one of e's answers, picked at random, and its shuffler,
// while e is current; nil when e is nil, used up, or built from another
// view or Authorizer.
func (s *Server) variant(e *packedAnswer) ([]byte, *shuffler) {
	if e == nil || (!e.shuffled && e.uses.Add(-1) < 0) {
		return nil, nil
	}
	if authz, err := s.authorizer(); err != nil || authz != e.authz || s.views.get(e.service) != e.view {
		return nil, nil
	}
	i := rand.IntN(len(e.variants))
	return e.variants[i], e.shufflers[i]
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
		sh := newShuffler(b)
		e.variants, e.shufflers = append(e.variants, b), append(e.shufflers, sh)
		e.bytes += len(b)
		e.shuffled = sh != nil && (i == 0 || e.shuffled)
	}
	e.uses.Store(int64(len(e.variants) * variantUses))
	if v.index != 0 {
		s.cache.put(key, e)
	}
	i := rand.IntN(len(e.variants))
	return withID(req, e.variants[i], e.shufflers[i]), nil
}

// withID is a copy of packed answer b for req, shuffled with sh when
// not nil: its id, and the RD and CD bits it asked with.
func withID(req *dns.Msg, b []byte, sh *shuffler) *[]byte {
	out := getBuffer(len(b))
	if sh != nil {
		sh.copyShuffled(*out, b, new(shuffleScratch))
	} else {
		copy(*out, b)
	}
	var flags uint16
	if req.RecursionDesired {
		flags |= flagRD
	}
	if req.CheckingDisabled {
		flags |= flagCD
	}
	setID(*out, req.Id, flags)
	return out
}

// The header bits a reply copies from its question (miekg/dns's SetReply,
// for opcode QUERY).
const flagRD, flagCD = 1 << 8, 1 << 4

// setID sets a packed reply's id, and its RD and CD bits to those in
// qflags (a question's flags).
func setID(b []byte, id, qflags uint16) {
	binary.BigEndian.PutUint16(b, id)
	flags := binary.BigEndian.Uint16(b[2:])&^(flagRD|flagCD) | qflags&(flagRD|flagCD)
	binary.BigEndian.PutUint16(b[2:], flags)
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
