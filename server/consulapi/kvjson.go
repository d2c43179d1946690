package consulapi

import (
	"encoding/base64"
	"net/http"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// KV reads are the answers a leader writes most (every blocking query
// that wakes reads one), and encoding/json's reflection was 4% of a
// leader's CPU with 10,000 parked queries. kvEntry encodes itself; the
// bytes are encoding/json's own, HTML-safe escaping included
// (TestKVEntryJSONMatchesEncodingJSON, FuzzKVEntryJSON).

// MarshalJSON is appendJSON, for kvEntry inside other values (txn).
func (e kvEntry) MarshalJSON() ([]byte, error) { return e.appendJSON(nil), nil }

// appendJSON appends e as encoding/json encodes it.
func (e *kvEntry) appendJSON(b []byte) []byte {
	b = append(b, `{"LockIndex":`...)
	b = strconv.AppendUint(b, e.LockIndex, 10)
	b = append(b, `,"Key":`...)
	b = appendJSONString(b, e.Key)
	b = append(b, `,"Flags":`...)
	b = strconv.AppendUint(b, e.Flags, 10)
	if e.Value == nil {
		b = append(b, `,"Value":null`...)
	} else {
		b = append(b, `,"Value":"`...)
		b = base64.StdEncoding.AppendEncode(b, e.Value)
		b = append(b, '"')
	}
	b = append(b, `,"CreateIndex":`...)
	b = strconv.AppendUint(b, e.CreateIndex, 10)
	b = append(b, `,"ModifyIndex":`...)
	b = strconv.AppendUint(b, e.ModifyIndex, 10)
	if e.Session != "" {
		b = append(b, `,"Session":`...)
		b = appendJSONString(b, e.Session)
	}
	return append(b, '}')
}

// writeKVPair answers a single-key read with kv as writeKVEntries would
// with kv's entry, in a pooled buffer and without copying the key: it is
// the answer a leader writes most, and each allocation was one more
// object per read for the collector.
func writeKVPair(w http.ResponseWriter, kv *lodestonepb.KeyValue) {
	bp := answerBuffers.Get().(*[]byte)
	b := append((*bp)[:0], `[{"LockIndex":`...)
	b = strconv.AppendUint(b, kv.LockIndex, 10)
	b = append(b, `,"Key":`...)
	b = appendJSONString(b, kv.Key)
	b = append(b, `,"Flags":`...)
	b = strconv.AppendUint(b, kv.Flags, 10)
	b = appendValue(b, kv.Value)
	b = append(b, `,"CreateIndex":`...)
	b = strconv.AppendUint(b, kv.CreateIndex, 10)
	b = append(b, `,"ModifyIndex":`...)
	b = strconv.AppendUint(b, kv.ModifyIndex, 10)
	if kv.Session != "" {
		b = append(b, `,"Session":`...)
		b = appendJSONString(b, kv.Session)
	}
	b = append(b, "}]\n"...)
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(http.StatusOK)
	// NB: the status line is out; a write error can only be a broken
	// connection, which the client sees. Write has copied b or sent it
	// when it returns, so b goes back to the pool.
	_, _ = w.Write(b)
	if cap(b) <= maxPooledAnswer {
		*bp = b
		answerBuffers.Put(bp)
	}
}

// maxPooledAnswer bounds the buffers answerBuffers keeps: one large value
// read must not pin its buffer.
const maxPooledAnswer = 16 << 10

var answerBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// appendValue appends a kvEntry's "Value" field, from its leading comma:
// null when empty, as Consul.
func appendValue(b, value []byte) []byte {
	b = append(b, `,"Value":`...)
	if len(value) == 0 {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, value)
	return append(b, '"')
}

// writeKVEntries answers with entries as writeJSON would.
func writeKVEntries(w http.ResponseWriter, entries []kvEntry) {
	n := 2
	for i := range entries {
		e := &entries[i]
		n += 120 + 2*len(e.Key) + base64.StdEncoding.EncodedLen(len(e.Value)) + 2*len(e.Session)
	}
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i := range entries {
		if i > 0 {
			b = append(b, ',')
		}
		b = entries[i].appendJSON(b)
	}
	b = append(b, "]\n"...)
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(http.StatusOK)
	// NB: the status line is out; a write error can only be a broken
	// connection, which the client sees.
	_, _ = w.Write(b)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s quoted as encoding/json quotes it with HTML
// escaping on (json.Encoder's default): <, > and & as \u003c, \u003e and
// \u0026, U+2028 and U+2029 escaped, invalid UTF-8 as U+FFFD.
func appendJSONString[S string | []byte](b []byte, s S) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := decodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// decodeRune is utf8.DecodeRuneInString or utf8.DecodeRune, by s's type.
func decodeRune[S string | []byte](s S) (rune, int) {
	switch v := any(s).(type) {
	case string:
		return utf8.DecodeRuneInString(v)
	default:
		return utf8.DecodeRune(v.([]byte))
	}
}
