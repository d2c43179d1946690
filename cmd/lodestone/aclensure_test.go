package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"
	"github.com/lodestone-kv/lodestone/server"
	"github.com/lodestone-kv/lodestone/server/servertest"
)

// writeSecret writes one secret to a file of its own and returns the path.
func writeSecret(t *testing.T, secret string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

type tokenJSON struct {
	AccessorID, SecretID, Description string
	Policies                          []struct{ ID, Name string }
}

func parseToken(t *testing.T, out string) tokenJSON {
	t.Helper()
	var tok tokenJSON
	if err := json.Unmarshal([]byte(out), &tok); err != nil {
		t.Fatalf("token json: %v\n%s", err, out)
	}
	return tok
}

// TestACLBootstrapPresetSecret: `acl bootstrap FILE` makes FILE's UUID the
// management token; a repeat fails unless --allow-bootstrapped, which then
// checks that the secret still is a management token.
func TestACLBootstrapPresetSecret(t *testing.T) {
	env := aclServer(t)
	const preset = "0f5e2a4c-8d1b-4e6f-a3c7-5b9d2e1f4a68"
	file := writeSecret(t, preset)

	cli(t, env, "", "acl", "bootstrap", "--allow-bootstrapped").failed(t, 2, "--allow-bootstrapped needs FILE")
	cli(t, env, "", "acl", "bootstrap", file, "--wait", "-1s").failed(t, 2, "--wait -1s")
	cli(t, env, "", "acl", "bootstrap", file, "extra").failed(t, 2, "want [FILE], got 2 argument(s)")
	cli(t, env, "", "acl", "bootstrap", filepath.Join(t.TempDir(), "missing")).failed(t, 2, "FILE:", "no such file")
	cli(t, env, "", "acl", "bootstrap", writeSecret(t, "not-a-uuid")).failed(t, 1, "Invalid BootstrapSecret: it must be a UUID", "HTTP 400")

	boot := parseToken(t, cli(t, env, "", "acl", "bootstrap", file, "--format", "json").ok(t).stdout)
	if boot.SecretID != preset || len(boot.Policies) != 1 || boot.Policies[0].Name != "global-management" {
		t.Fatalf("bootstrap with FILE: %+v, want secret %s with global-management", boot, preset)
	}
	cli(t, env, "", "acl", "bootstrap", file).failed(t, 1, "ACL bootstrap no longer allowed", "HTTP 403")

	again := cli(t, env, "", "acl", "bootstrap", file, "--allow-bootstrapped", "--format", "json").ok(t)
	if tok := parseToken(t, again.stdout); tok.AccessorID != boot.AccessorID || tok.SecretID != preset {
		t.Errorf("repeat with --allow-bootstrapped printed %+v, want the bootstrap token %s", tok, boot.AccessorID)
	}
	if !strings.Contains(again.stderr, "already bootstrapped: the secret in "+file+" is a working management token") {
		t.Errorf("repeat stderr %q does not say the system was already bootstrapped", again.stderr)
	}
	cli(t, env, preset+"\n", "acl", "bootstrap", "-", "--allow-bootstrapped").ok(t)

	// A secret nobody issued, and one whose token is not management.
	cli(t, env, "", "acl", "bootstrap", writeSecret(t, "11111111-2222-4333-8444-555555555555"), "--allow-bootstrapped").
		failed(t, 1, "already bootstrapped, and the secret in", "is not a working management token", "ACL not found")
	const narrow = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
	mgmt := map[string]string{envHTTPAddr: env[envHTTPAddr], envToken: preset}
	cli(t, mgmt, "", "acl", "token", "create", "--secret", narrow).ok(t)
	cli(t, env, "", "acl", "bootstrap", writeSecret(t, narrow), "--allow-bootstrapped").
		failed(t, 1, "is not a working management token", "does not link the global-management policy")
}

// TestACLBootstrapWaitsForTheCluster: with --wait, a bootstrap started
// before any server listens succeeds once one does.
func TestACLBootstrapWaitsForTheCluster(t *testing.T) {
	httpAddr := testnet.FreeAddr(t)
	const preset = "3c2b1a09-8f7e-4d6c-9b5a-493827160504"
	file := writeSecret(t, preset)
	var stdout, stderr syncWriter
	done := make(chan int, 1)
	go func() {
		env := map[string]string{envHTTPAddr: httpAddr}
		done <- run(context.Background(), []string{"acl", "bootstrap", file, "--wait", "60s", "--format", "json"},
			strings.NewReader(""), &stdout, &stderr, func(k string) string { return env[k] })
	}()
	waitFor(t, 10*time.Second, "the bootstrap to report that it waits", func() bool {
		return strings.Contains(stderr.String(), "waiting for the cluster to answer")
	})
	servertest.Start(t, func(c *server.Config) { c.ListenHTTP = httpAddr })
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("bootstrap exit %d, stderr: %s", code, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("bootstrap still waiting 60s after the server started")
	}
	if tok := parseToken(t, stdout.String()); tok.SecretID != preset {
		t.Errorf("bootstrap after waiting: %+v, want secret %s", tok, preset)
	}

	// Without --wait, one attempt: an address nobody listens on fails at once.
	start := time.Now()
	cli(t, map[string]string{envHTTPAddr: testnet.FreeAddr(t)}, "", "acl", "bootstrap").failed(t, 1, "connection refused")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("bootstrap without --wait took %v against a closed port", d)
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestACLCreateUpdateExisting: with --update-existing, policy and token
// create converge on what they are given instead of failing on a second
// run; without it, a second create still fails.
func TestACLCreateUpdateExisting(t *testing.T) {
	env := aclServer(t)
	boot := parseToken(t, cli(t, env, "", "acl", "bootstrap", "--format", "json").ok(t).stdout)
	env[envToken] = boot.SecretID

	cli(t, env, "", "acl", "policy", "create", "--name", "gw", "--rules", `key_prefix "gateway/" { policy = "read" }`, "--update-existing").ok(t)
	cli(t, env, "", "acl", "policy", "create", "--name", "gw", "--rules", `key_prefix "x/" { policy = "read" }`).
		failed(t, 1, "gw", "HTTP")
	upd := cli(t, env, "", "acl", "policy", "create", "--name", "gw", "--rules", `service_prefix "" { policy = "read" }`,
		"--description", "v2", "--update-existing").ok(t)
	if !strings.Contains(upd.stderr, `Policy "gw" existed: updated it`) {
		t.Errorf("policy update stderr %q", upd.stderr)
	}
	read := cli(t, env, "", "acl", "policy", "read", "--name", "gw").ok(t).stdout
	if !strings.Contains(read, `service_prefix ""`) || strings.Contains(read, "gateway/") || !strings.Contains(read, "v2") {
		t.Errorf("policy after --update-existing:\n%s", read)
	}
	if list := cli(t, env, "", "acl", "policy", "list").ok(t).stdout; strings.Count(list, "gw") != 1 {
		t.Errorf("policy list after the update:\n%s", list)
	}

	const secret = "9d8c7b6a-5f4e-4d3c-8b2a-190817263544"
	file := writeSecret(t, secret)
	cli(t, env, "", "acl", "token", "create", "--update-existing").failed(t, 2, "--update-existing needs --secret or --secret-file")
	cli(t, env, "", "acl", "token", "create", "--secret", secret, "--secret-file", file).failed(t, 2, "at most one of --secret and --secret-file")
	cli(t, env, "", "acl", "token", "create", "--secret-file", filepath.Join(t.TempDir(), "none")).failed(t, 2, "--secret-file", "no such file")

	first := cli(t, env, "", "acl", "token", "create", "--secret-file", file, "--policy-name", "gw", "--description", "d1", "--update-existing", "--format", "json").ok(t)
	tok := parseToken(t, first.stdout)
	if tok.SecretID != secret || strings.Contains(first.stderr, "existed") {
		t.Fatalf("first create: %+v, stderr %q", tok, first.stderr)
	}
	cli(t, env, "", "acl", "token", "create", "--secret-file", file).failed(t, 1, "SecretID is already in use")
	second := cli(t, env, "", "acl", "token", "create", "--secret-file", file, "--description", "d2", "--update-existing").ok(t)
	if !strings.Contains(second.stderr, "Token "+tok.AccessorID+" existed: updated its description and links") {
		t.Errorf("second create stderr %q", second.stderr)
	}
	self := parseToken(t, cli(t, map[string]string{envHTTPAddr: env[envHTTPAddr], envToken: secret}, "", "acl", "token", "read", "--self", "--format", "json").ok(t).stdout)
	if self.AccessorID != tok.AccessorID || self.Description != "d2" || len(self.Policies) != 0 {
		t.Errorf("token after --update-existing: %+v, want %s with description d2 and no policy", self, tok.AccessorID)
	}
	cli(t, env, "", "acl", "token", "create", "--secret-file", file, "--accessor", "12345678-1234-4234-8234-123456789012", "--update-existing").
		failed(t, 1, "a token with this secret exists with accessor "+tok.AccessorID)
}
