package consulapi

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"
)

// stdKVEntry has kvEntry's fields and tags but not its MarshalJSON: what
// encoding/json makes of it is the reference.
type stdKVEntry struct {
	LockIndex   uint64
	Key         string
	Flags       uint64
	Value       []byte
	CreateIndex uint64
	ModifyIndex uint64
	Session     string `json:",omitempty"`
}

var kvJSONCases = []kvEntry{
	{},
	{Key: "plain/key", Value: []byte("value"), CreateIndex: 1, ModifyIndex: 1<<64 - 1, Flags: 42, LockIndex: 3, Session: "s-1"},
	{Key: "<html> & \"quotes\" \\ back", Value: []byte{}},
	{Key: "ctl \x00\x01\b\f\n\r\t\x1f\x7f", Value: []byte{0, 255, 1}},
	{Key: "bad utf8 \xff\xfe and \xe2\x82", Session: "\u2028\u2029 line seps"},
	{Key: "unicode é 日本 🎉", Value: bytes.Repeat([]byte("x"), 1000)},
}

// checkKVJSON compares writeKVEntries and MarshalJSON with encoding/json
// byte for byte.
func checkKVJSON(t *testing.T, entries []kvEntry) {
	t.Helper()
	std := make([]stdKVEntry, len(entries))
	for i, e := range entries {
		std[i] = stdKVEntry(e)
	}
	var want bytes.Buffer
	if err := json.NewEncoder(&want).Encode(std); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	writeKVEntries(rec, entries)
	if got := rec.Body.String(); got != want.String() {
		t.Fatalf("writeKVEntries:\n got %q\nwant %q", got, want.String())
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	for i, e := range entries {
		got, err := json.Marshal(e) // NB: through MarshalJSON, as a txn result
		if err != nil {
			t.Fatal(err)
		}
		ref, _ := json.Marshal(std[i])
		if !bytes.Equal(got, ref) {
			t.Fatalf("MarshalJSON:\n got %s\nwant %s", got, ref)
		}
	}
}

// TestKVEntryJSONMatchesEncodingJSON: the hand-written encoding of KV
// answers is encoding/json's, byte for byte, escapes and all.
func TestKVEntryJSONMatchesEncodingJSON(t *testing.T) {
	checkKVJSON(t, kvJSONCases)
	for _, e := range kvJSONCases {
		checkKVJSON(t, []kvEntry{e})
	}
}

func FuzzKVEntryJSON(f *testing.F) {
	for _, e := range kvJSONCases {
		f.Add(e.Key, e.Value, e.Session, e.Flags)
	}
	f.Fuzz(func(t *testing.T, key string, value []byte, session string, flags uint64) {
		checkKVJSON(t, []kvEntry{{Key: key, Value: value, Session: session, Flags: flags, CreateIndex: flags / 3}})
	})
}

// BenchmarkKVAnswer writes a blocking query's usual answer, one entry,
// both ways in one run.
func BenchmarkKVAnswer(b *testing.B) {
	entries := []kvEntry{{Key: "blk/key-01234", Value: bytes.Repeat([]byte("v"), 64), CreateIndex: 12, ModifyIndex: 123456, Flags: 0}}
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			writeJSON(httptest.NewRecorder(), 200, entries)
		}
	})
	b.Run("kvEntry", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			writeKVEntries(httptest.NewRecorder(), entries)
		}
	})
}
