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
	return appendKVObject(b, e.LockIndex, e.Key, e.Flags, e.Value, e.CreateIndex, e.ModifyIndex, e.Session)
}

// appendKVObject appends one KV entry's JSON object: kvEntry's encoding,
// for a key held as a string or as the bytes of a KeyValue (so a
// single-key read need not copy it). A nil value is null.
func appendKVObject[K string | []byte](b []byte, lockIndex uint64, key K, flags uint64, value []byte, createIndex, modifyIndex uint64, session string) []byte {
	b = append(b, `{"LockIndex":`...)
	b = strconv.AppendUint(b, lockIndex, 10)
	b = append(b, `,"Key":`...)
	b = appendJSONString(b, key)
	b = append(b, `,"Flags":`...)
	b = strconv.AppendUint(b, flags, 10)
	if value == nil {
		b = append(b, `,"Value":null`...)
	} else {
		b = append(b, `,"Value":"`...)
		b = base64.StdEncoding.AppendEncode(b, value)
		b = append(b, '"')
	}
	b = append(b, `,"CreateIndex":`...)
	b = strconv.AppendUint(b, createIndex, 10)
	b = append(b, `,"ModifyIndex":`...)
	b = strconv.AppendUint(b, modifyIndex, 10)
	if session != "" {
		b = append(b, `,"Session":`...)
		b = appendJSONString(b, session)
	}
	return append(b, '}')
}

// writeKVPair answers a single-key read with kv as writeKVEntries would
// with kv's entry, in a pooled buffer and without copying the key: it is
// the answer a leader writes most, and each allocation was one more
// object per read for the collector.
func writeKVPair(w http.ResponseWriter, kv *lodestonepb.KeyValue) {
	bp := answerBuffers.Get().(*[]byte)
	value := kv.Value
	if len(value) == 0 {
		value = nil // null when empty, as toEntry
	}
	b := append((*bp)[:0], '[')
	b = appendKVObject(b, kv.LockIndex, kv.Key, kv.Flags, value, kv.CreateIndex, kv.ModifyIndex, kv.Session)
	b = append(b, "]\n"...)
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
