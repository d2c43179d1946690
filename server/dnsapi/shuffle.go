package dnsapi

import (
	"encoding/binary"
	"math/rand/v2"
)

// A kept answer whose answer section is all A, AAAA or SRV records is
// shuffled on every copy, in its packed bytes: its records move as whole
// chunks, and the compression pointers of the additional section that
// point into them (the SRV targets' addresses and node meta) move with
// them. Such an answer is then never built again for order's sake (its
// variants' uses do not run out); a truncated one still is, so that which
// instances it holds changes too. Shuffling the bytes costs a copy per
// record; building new orders from the records cost a pack per variant,
// a large share of the fast path's CPU, and, every few hundred answers,
// a stall of every answer behind it.
//
// The layout this relies on is miekg/dns's: each answer's owner is a
// pointer to the question's name (offset 12), an SRV target is written
// out in full (miekg/dns never compresses it), and A, AAAA, TXT and OPT
// records carry no names in their data. newShuffler checks each of these
// and says nil otherwise, and the answer is then copied as it is.

// shuffler says where a packed answer's records lie.
type shuffler struct {
	chunks []int    // offset of each answer record, then the section's end
	ptrs   []ptrFix // pointers after the answer section into it
}

// ptrFix is a compression pointer at offset at, to rel bytes into answer
// record chunk.
type ptrFix struct{ at, chunk, rel int }

// shuffleScratch is one copier's working space.
type shuffleScratch struct {
	perm, starts []int
}

// newShuffler reads packed answer b; nil when its records cannot move or
// there are fewer than two.
func newShuffler(b []byte) *shuffler {
	if len(b) < headerLen || b[2]&0x02 != 0 { // NB: TC
		return nil
	}
	qd, an, ns, ar := binary.BigEndian.Uint16(b[4:]), int(binary.BigEndian.Uint16(b[6:])),
		binary.BigEndian.Uint16(b[8:]), int(binary.BigEndian.Uint16(b[10:]))
	if qd != 1 || an < 2 || ns != 0 {
		return nil
	}
	off, ok := skipFullName(b, headerLen)
	if !ok {
		return nil
	}
	off += 4
	sh := &shuffler{chunks: make([]int, 0, an+1)}
	var rtype uint16
	for i := range an {
		sh.chunks = append(sh.chunks, off)
		if off+12 > len(b) || b[off] != 0xc0 || b[off+1] != headerLen {
			return nil
		}
		t, rdlen := binary.BigEndian.Uint16(b[off+2:]), int(binary.BigEndian.Uint16(b[off+10:]))
		if i == 0 {
			rtype = t
		}
		off += 12
		if t != rtype || off+rdlen > len(b) {
			return nil
		}
		switch t {
		case typeA, typeAAAA:
		case typeSRV:
			if end, ok := skipFullName(b, off+6); !ok || end != off+rdlen {
				return nil
			}
		default:
			return nil
		}
		off += rdlen
	}
	sh.chunks = append(sh.chunks, off)
	for range ar {
		end, ptrAt, ok := skipName(b, off)
		if !ok || end+10 > len(b) {
			return nil
		}
		if ptrAt >= 0 {
			p := int(binary.BigEndian.Uint16(b[ptrAt:]) & 0x3fff)
			if j := sh.chunkOf(p); j >= 0 {
				sh.ptrs = append(sh.ptrs, ptrFix{at: ptrAt, chunk: j, rel: p - sh.chunks[j]})
			}
		}
		switch binary.BigEndian.Uint16(b[end:]) {
		case typeA, typeAAAA, typeTXT, typeOPT:
		default:
			return nil
		}
		off = end + 10 + int(binary.BigEndian.Uint16(b[end+8:]))
	}
	if off != len(b) {
		return nil
	}
	return sh
}

const (
	typeA    = 1
	typeTXT  = 16
	typeAAAA = 28
	typeSRV  = 33
)

// chunkOf is the answer record holding offset p, or -1.
func (sh *shuffler) chunkOf(p int) int {
	for j := range len(sh.chunks) - 1 {
		if p >= sh.chunks[j] && p < sh.chunks[j+1] {
			return j
		}
	}
	return -1
}

// skipFullName is the offset after the name at b[off:], which must hold
// no pointer.
func skipFullName(b []byte, off int) (int, bool) {
	end, ptrAt, ok := skipName(b, off)
	return end, ok && ptrAt < 0
}

// skipName is the offset after the name at b[off:], and where its
// pointer is (-1: none).
func skipName(b []byte, off int) (end, ptrAt int, ok bool) {
	for off < len(b) {
		n := int(b[off])
		switch {
		case n == 0:
			return off + 1, -1, true
		case n&0xc0 == 0xc0:
			if off+2 > len(b) {
				return off, -1, false
			}
			return off + 2, off, true
		case n > 63:
			return off, -1, false
		}
		off += 1 + n
	}
	return off, -1, false
}

// copyShuffled copies src into dst (as long) with its answer records in
// a random order.
func (sh *shuffler) copyShuffled(dst, src []byte, s *shuffleScratch) {
	n := len(sh.chunks) - 1
	if cap(s.perm) < n {
		s.perm, s.starts = make([]int, n), make([]int, n)
	}
	perm, starts := s.perm[:n], s.starts[:n]
	for i := range perm {
		perm[i] = i
	}
	for i := n - 1; i > 0; i-- {
		j := rand.IntN(i + 1)
		perm[i], perm[j] = perm[j], perm[i]
	}
	first, end := sh.chunks[0], sh.chunks[n]
	copy(dst[:first], src[:first])
	off := first
	for _, j := range perm {
		starts[j] = off
		off += copy(dst[off:], src[sh.chunks[j]:sh.chunks[j+1]])
	}
	copy(dst[end:], src[end:])
	for _, f := range sh.ptrs {
		binary.BigEndian.PutUint16(dst[f.at:], 0xc000|uint16(starts[f.chunk]+f.rel))
	}
}
