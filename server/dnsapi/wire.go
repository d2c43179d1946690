package dnsapi

import (
	"encoding/binary"

	"github.com/miekg/dns"
)

// The UDP fast path reads a question straight from its datagram, and
// only a question of the plainest shape: one that miekg/dns would unpack
// without error to a message whose answer depends on nothing the cache
// key leaves out. Anything else goes to the full handler as it came, so
// what it answers there (FORMERR, NOTIMP, silence) stays miekg/dns's.

// wireQuery is a question read from a datagram.
type wireQuery struct {
	id, flags     uint16
	qtype, qclass uint16
	edns          bool
	size          uint16 // EDNS0 buffer size; 0 without EDNS0
}

const (
	headerLen  = 12
	flagQR     = 1 << 15
	opcodeMask = 0xf << 11
	typeOPT    = 41
	// EDNS0 options miekg/dns unpacks without ever failing; a question
	// with another goes to the full handler.
	optCookie  = 10
	optPadding = 12
)

// readQuery reads b as a question the fast path answers, appending its
// cache key (cache.go) to key. ok is false for any other datagram.
func readQuery(b, key []byte) (q wireQuery, out []byte, ok bool) {
	if len(b) < headerLen {
		return q, key, false
	}
	q.id = binary.BigEndian.Uint16(b)
	q.flags = binary.BigEndian.Uint16(b[2:])
	qd, an, ns, ar := binary.BigEndian.Uint16(b[4:]), binary.BigEndian.Uint16(b[6:]),
		binary.BigEndian.Uint16(b[8:]), binary.BigEndian.Uint16(b[10:])
	if q.flags&(flagQR|opcodeMask) != 0 || qd != 1 || an != 0 || ns != 0 || ar > 1 {
		return q, key, false
	}
	off, out, ok := readName(b, headerLen, key)
	if !ok || off+4 > len(b) {
		return q, key, false
	}
	q.qtype, q.qclass = binary.BigEndian.Uint16(b[off:]), binary.BigEndian.Uint16(b[off+2:])
	off += 4
	if !cacheable(q.qtype) || q.qclass != dns.ClassINET {
		return q, key, false
	}
	if ar == 1 {
		if off, ok = readOPT(b, off, &q); !ok {
			return q, key, false
		}
	}
	if off != len(b) {
		return q, key, false
	}
	return q, appendKeyTail(out, q.qtype, q.qclass, q.edns, q.size, false), true
}

// readName reads the uncompressed name at b[off:] as miekg/dns writes it
// in text (labels of letters, digits, hyphens and underscores, which it
// writes unescaped, each followed by a dot), appending that to key. The
// root name alone is refused: it is never a service.
func readName(b []byte, off int, key []byte) (int, []byte, bool) {
	start := len(key)
	for {
		if off >= len(b) {
			return off, key[:start], false
		}
		n := int(b[off])
		off++
		if n == 0 {
			break
		}
		if n > 63 || off+n > len(b) {
			return off, key[:start], false
		}
		for _, c := range b[off : off+n] {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return off, key[:start], false
			}
		}
		key = append(append(key, b[off:off+n]...), '.')
		off += n
	}
	// NB: 255 octets on the wire is 254 characters of text with the
	// final dot; miekg/dns refuses longer names.
	if l := len(key) - start; l == 0 || l > 254 {
		return off, key[:start], false
	}
	return off, key, true
}

// readOPT reads the OPT record at b[off:]: the root name, type OPT, the
// buffer size in its class, and options that are cookies or padding.
func readOPT(b []byte, off int, q *wireQuery) (int, bool) {
	if off+11 > len(b) || b[off] != 0 || binary.BigEndian.Uint16(b[off+1:]) != typeOPT {
		return off, false
	}
	q.edns, q.size = true, binary.BigEndian.Uint16(b[off+3:])
	rdlen := int(binary.BigEndian.Uint16(b[off+9:]))
	off += 11
	if off+rdlen != len(b) {
		return off, false
	}
	for off < len(b) {
		if off+4 > len(b) {
			return off, false
		}
		code, n := binary.BigEndian.Uint16(b[off:]), int(binary.BigEndian.Uint16(b[off+2:]))
		off += 4
		if (code != optCookie && code != optPadding) || off+n > len(b) {
			return off, false
		}
		off += n
	}
	return off, true
}
