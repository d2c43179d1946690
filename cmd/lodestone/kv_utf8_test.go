package main

import (
	"strings"
	"testing"
)

// TestKVPutRefusesNonUTF8Key: the CLI sends a key that is not valid UTF-8
// to the server, which refuses it as it does over HTTP and gRPC; nothing
// is stored, so kv list has nothing it could not address back.
func TestKVPutRefusesNonUTF8Key(t *testing.T) {
	t.Parallel()
	env := startServer(t)
	cli(t, env, "", "kv", "put", "ok/caf\u00e9", "v").ok(t)
	cli(t, env, "", "kv", "put", "ok/bad\xffkey", "v").failed(t, 1, "key must be valid UTF-8", "0xff at byte 6")
	out := cli(t, env, "", "kv", "list", "ok/").ok(t).stdout
	if strings.Contains(out, "bad") || !strings.Contains(out, "ok/caf\u00e9") {
		t.Fatalf("kv list ok/ after the refused put:\n%s", out)
	}
	if got := cli(t, env, "", "kv", "get", "ok/caf\u00e9").ok(t).stdout; got != "v\n" {
		t.Fatalf("kv get of the listed UTF-8 key printed %q", got)
	}
}
