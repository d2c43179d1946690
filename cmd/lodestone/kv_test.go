package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// The README's first promise: put, then get prints the value.
func TestKVPutGet(t *testing.T) {
	t.Parallel()
	_, env := startMemory(t)
	cli(t, env, "", "kv", "put", "greeting", "hello").ok(t)
	if got, want := cli(t, env, "", "kv", "get", "greeting").ok(t).stdout, "hello\n"; got != want {
		t.Errorf("kv get printed %q, want %q", got, want)
	}
	if got, want := cli(t, env, "", "kv", "get", "greeting", "--stale").ok(t).stdout, "hello\n"; got != want {
		t.Errorf("kv get --stale printed %q, want %q", got, want)
	}

	var entry jsonKV
	out := cli(t, env, "", "kv", "get", "greeting", "-o", "json").ok(t).stdout
	if err := json.Unmarshal([]byte(out), &entry); err != nil {
		t.Fatalf("kv get -o json printed %q: %v", out, err)
	}
	if entry.Key != "greeting" || entry.Value == nil || string(*entry.Value) != "hello" || entry.ModifyIndex == 0 {
		t.Errorf("kv get -o json = %+v, want the whole entry", entry)
	}
}

func TestKVGetMissing(t *testing.T) {
	t.Parallel()
	_, env := startMemory(t)
	r := cli(t, env, "", "kv", "get", "x")
	r.failed(t, 1, `key "x" not found`, "lodestone kv list")
	if r.stdout != "" {
		t.Errorf("stdout = %q, want nothing", r.stdout)
	}
}

func TestKVPutStdinRoundTrip(t *testing.T) {
	t.Parallel()
	_, env := startMemory(t)
	const doc = "line one\nline two\n"
	cli(t, env, doc, "kv", "put", "doc", "-").ok(t)
	if got := cli(t, env, "", "kv", "get", "doc").ok(t).stdout; got != doc {
		t.Errorf("kv get printed %q, want %q (no newline added to text ending in one)", got, doc)
	}
}

func TestKVCAS(t *testing.T) {
	t.Parallel()
	_, env := startMemory(t)
	cli(t, env, "", "kv", "put", "lock", "me", "--cas", "0").ok(t)
	cli(t, env, "", "kv", "put", "lock", "you", "--cas", "0").failed(t, 1, `put "lock"`, "failed precondition", "--cas")

	var entry jsonKV
	if err := json.Unmarshal([]byte(cli(t, env, "", "kv", "get", "lock", "-o", "json").ok(t).stdout), &entry); err != nil {
		t.Fatal(err)
	}
	cli(t, env, "", "kv", "delete", "lock", "--cas", "999").failed(t, 1, "failed precondition")
	idx := jsonNumber(entry.ModifyIndex)
	cli(t, env, "", "kv", "put", "lock", "you", "--cas", idx, "--flags", "3").ok(t)
	if got := cli(t, env, "", "kv", "get", "lock").ok(t).stdout; got != "you\n" {
		t.Errorf("after CAS put, value = %q", got)
	}
}

func TestKVListAndDelete(t *testing.T) {
	t.Parallel()
	_, env := startMemory(t)
	for _, k := range []string{"app/a", "app/b", "app/c", "other"} {
		cli(t, env, "", "kv", "put", k, "v-"+k).ok(t)
	}
	out := cli(t, env, "", "kv", "list", "app/").ok(t).stdout
	if got, want := strings.Count(out, "\n"), 4; got != want {
		t.Errorf("kv list app/ printed %d lines, want %d:\n%s", got, want, out)
	}
	var page struct {
		KVs  []jsonKV `json:"kvs"`
		More bool     `json:"more"`
	}
	if err := json.Unmarshal([]byte(cli(t, env, "", "kv", "list", "--limit", "2", "--keys-only", "-o", "json").ok(t).stdout), &page); err != nil {
		t.Fatal(err)
	}
	if len(page.KVs) != 2 || !page.More || page.KVs[0].Value != nil {
		t.Errorf("kv list --limit 2 --keys-only = %+v, want 2 keys, more, no values", page)
	}
	if got, want := cli(t, env, "", "kv", "delete", "app/", "--prefix").ok(t).stdout, "deleted 3 keys\n"; got != want {
		t.Errorf("kv delete --prefix printed %q, want %q", got, want)
	}
	if got, want := cli(t, env, "", "kv", "delete", "other").ok(t).stdout, "deleted 1 key\n"; got != want {
		t.Errorf("kv delete printed %q, want %q", got, want)
	}
	if got, want := cli(t, env, "", "kv", "list").ok(t).stdout, "KEY  FLAGS  MODIFY-INDEX  VALUE\n"; got != want {
		t.Errorf("empty kv list printed %q, want %q", got, want)
	}
}

// TestEndpointsFlagBeatsEnv: --endpoints wins over LODESTONE_ENDPOINTS.
func TestEndpointsFlagBeatsEnv(t *testing.T) {
	t.Parallel()
	s, _ := startMemory(t)
	env := map[string]string{envEndpoints: "127.0.0.1:1"}
	cli(t, env, "", "--endpoints", s.Addr, "kv", "put", "k", "v").ok(t)
	cli(t, nil, "", "kv", "put", "k", "v", "--endpoints", "127.0.0.1:1,"+s.Addr).ok(t)
}

func jsonNumber(n uint64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// kvFixture is a fixed listing for the render goldens.
func kvFixture() []*lodestonepb.KeyValue {
	return []*lodestonepb.KeyValue{
		{Key: []byte("app/config"), Value: []byte(`{"port":8080}`), CreateIndex: 5, ModifyIndex: 9, Flags: 0},
		{Key: []byte("app/motd"), Value: []byte("a long message of the day that goes on past the forty rune preview"), CreateIndex: 6, ModifyIndex: 6, Flags: 42},
		{Key: []byte("app/tabs"), Value: []byte("col1\tcol2\n"), CreateIndex: 7, ModifyIndex: 7},
		{Key: []byte("bin/blob"), Value: []byte{0xff, 0xfe, 0x00, 0x01}, CreateIndex: 8, ModifyIndex: 8},
		{Key: []byte("empty"), Value: nil, CreateIndex: 10, ModifyIndex: 12, LockIndex: 1, Session: "adf4238a-882b-9ddc-4a9d-5b6758e4159e"},
	}
}

func TestRenderKVGolden(t *testing.T) {
	t.Parallel()
	kvs := kvFixture()
	for _, tc := range []struct {
		command, name string
		render        func(*bytes.Buffer) error
	}{
		{"kv-get", "text", func(b *bytes.Buffer) error { return renderKVGet(b, outputTable, kvs[0]) }},
		{"kv-get", "text-ending-in-newline", func(b *bytes.Buffer) error { return renderKVGet(b, outputTable, kvs[2]) }},
		{"kv-get", "json", func(b *bytes.Buffer) error { return renderKVGet(b, outputJSON, kvs[0]) }},
		{"kv-get", "json-empty-value", func(b *bytes.Buffer) error { return renderKVGet(b, outputJSON, kvs[4]) }},
		{"kv-list", "table", func(b *bytes.Buffer) error { return renderKVList(b, outputTable, kvs, false, false) }},
		{"kv-list", "keys-only", func(b *bytes.Buffer) error { return renderKVList(b, outputTable, kvs, true, false) }},
		{"kv-list", "more", func(b *bytes.Buffer) error { return renderKVList(b, outputTable, kvs[:2], false, true) }},
		{"kv-list", "json", func(b *bytes.Buffer) error { return renderKVList(b, outputJSON, kvs, false, false) }},
		{"kv-list", "json-keys-only-more", func(b *bytes.Buffer) error { return renderKVList(b, outputJSON, kvs[:2], true, true) }},
		{"kv-list", "json-empty", func(b *bytes.Buffer) error { return renderKVList(b, outputJSON, nil, false, false) }},
		{"kv-put", "table", func(b *bytes.Buffer) error {
			return renderKVPut(b, outputTable, "app/config", &lodestonepb.PutResponse{Kv: &lodestonepb.KeyValue{Key: []byte("app/config"), CreateIndex: 5, ModifyIndex: 9}})
		}},
		{"kv-put", "json", func(b *bytes.Buffer) error {
			return renderKVPut(b, outputJSON, "app/config", &lodestonepb.PutResponse{Kv: &lodestonepb.KeyValue{Key: []byte("app/config"), CreateIndex: 5, ModifyIndex: 9, Flags: 42}})
		}},
		{"kv-delete", "table", func(b *bytes.Buffer) error {
			return renderKVDelete(b, outputTable, &lodestonepb.DeleteResponse{Header: &lodestonepb.ResponseHeader{Index: 13}, Deleted: 3})
		}},
		{"kv-delete", "json", func(b *bytes.Buffer) error {
			return renderKVDelete(b, outputJSON, &lodestonepb.DeleteResponse{Header: &lodestonepb.ResponseHeader{Index: 13}, Deleted: 3})
		}},
	} {
		t.Run(tc.command+"/"+tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.render(&b); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.command, tc.name, b.Bytes())
		})
	}
}
