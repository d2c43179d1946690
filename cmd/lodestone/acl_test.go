package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/server/servertest"
)

// aclServer starts a one-member server and returns the CLI environment
// pointing at its HTTP API, once it leads.
func aclServer(t *testing.T) map[string]string {
	t.Helper()
	srv := servertest.Start(t, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Get("http://" + srv.HTTPAddr() + "/v1/status/leader")
		if err == nil {
			var leader string
			_ = json.NewDecoder(resp.Body).Decode(&leader)
			resp.Body.Close()
			if leader != "" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no leader within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return map[string]string{envHTTPAddr: srv.HTTPAddr()}
}

func TestACLCommands(t *testing.T) {
	env := aclServer(t)
	var boot struct{ SecretID, AccessorID string }
	if err := json.Unmarshal([]byte(cli(t, env, "", "acl", "bootstrap", "--format", "json").ok(t).stdout), &boot); err != nil || boot.SecretID == "" {
		t.Fatalf("bootstrap json: %v %+v", err, boot)
	}
	cli(t, env, "", "acl", "bootstrap").failed(t, 1, "ACL bootstrap no longer allowed (reset index: ", "HTTP 403")
	env[envToken] = boot.SecretID

	rules := filepath.Join(t.TempDir(), "kv.hcl")
	if err := os.WriteFile(rules, []byte(`key_prefix "app/" { policy = "write" }`), 0o644); err != nil {
		t.Fatal(err)
	}
	out := cli(t, env, "", "acl", "policy", "create", "--name", "kv-app", "--rules", "@"+rules, "--description", "app keys").ok(t).stdout
	if !strings.Contains(out, "Name:         kv-app") || !strings.Contains(out, `key_prefix "app/"`) {
		t.Errorf("policy create output:\n%s", out)
	}
	cli(t, env, `service_prefix "" { policy = "read" }`, "acl", "policy", "create", "--name", "svc", "--rules", "-").ok(t)
	cli(t, env, "", "acl", "policy", "create", "--name", "refused-policy", "--rules", `key "a" { policy = "admin" }`).
		failed(t, 1, `invalid policy "admin"`, "HTTP 400")
	list := cli(t, env, "", "acl", "policy", "list").ok(t).stdout
	// NB: a name no UUID can hold, unlike "bad".
	if strings.Count(list, "\n") != 4 || strings.Contains(list, "refused-policy") { // header, global-management, kv-app, svc
		t.Errorf("policy list:\n%s", list)
	}

	cli(t, env, "", "acl", "role", "create", "--name", "readers", "--policy-name", "svc").ok(t)
	var tok struct {
		AccessorID, SecretID string
		Policies, Roles      []struct{ Name string }
	}
	out = cli(t, env, "", "acl", "token", "create", "--description", "app", "--policy-name", "kv-app", "--role-name", "readers", "--secret", "preset-secret", "--format", "json").ok(t).stdout
	if err := json.Unmarshal([]byte(out), &tok); err != nil || tok.SecretID != "preset-secret" || len(tok.Policies) != 1 || len(tok.Roles) != 1 {
		t.Fatalf("token create: %v\n%s", err, out)
	}
	self := cli(t, map[string]string{envHTTPAddr: env[envHTTPAddr], "CONSUL_HTTP_TOKEN": "preset-secret"}, "", "acl", "token", "read", "--self").ok(t).stdout
	if !strings.Contains(self, tok.AccessorID) || !strings.Contains(self, "kv-app") {
		t.Errorf("read --self:\n%s", self)
	}
	upd := cli(t, env, "", "acl", "token", "update", "--id", tok.AccessorID, "--description", "v2", "--policy-name", "svc").ok(t).stdout
	if !strings.Contains(upd, "v2") || strings.Contains(upd, "kv-app") || !strings.Contains(upd, "preset-secret") {
		t.Errorf("token update:\n%s", upd)
	}
	if l := cli(t, env, "", "acl", "token", "list").ok(t).stdout; strings.Count(l, "\n") != 4 {
		t.Errorf("token list:\n%s", l)
	}
	cli(t, env, "", "acl", "token", "delete", "--id", tok.AccessorID).ok(t)
	cli(t, env, "", "acl", "token", "read", "--id", tok.AccessorID).failed(t, 1, "ACL not found", "HTTP 403")
	cli(t, env, "", "acl", "role", "delete", "--name", "readers").ok(t)
	cli(t, env, "", "acl", "policy", "delete", "--name", "kv-app").ok(t)
	cli(t, env, "", "acl", "token", "read").failed(t, 2, "exactly one of --id and --self")
	cli(t, env, "", "acl", "policy", "list", "--format", "yaml").failed(t, 2, `--format "yaml"`)
}

func TestTokenOf(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(file, []byte(" from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--token", "flag", "--token-file", file}, map[string]string{envToken: "env"}, "flag"},
		{[]string{"--token-file", file}, map[string]string{envToken: "env"}, "from-file"},
		{nil, map[string]string{envToken: "env", "CONSUL_HTTP_TOKEN": "consul"}, "env"},
		{nil, map[string]string{"CONSUL_HTTP_TOKEN": "consul"}, "consul"},
		{nil, map[string]string{envToken + "_FILE": file}, "from-file"},
		{nil, nil, ""},
	} {
		root := newRootCmd(func(k string) string { return c.env[k] })
		if err := root.ParseFlags(c.args); err != nil {
			t.Fatal(err)
		}
		got, err := tokenOf(root)
		if err != nil || got != c.want {
			t.Errorf("tokenOf(%v, %v) = %q, %v; want %q", c.args, c.env, got, err, c.want)
		}
	}
	root := newRootCmd(func(string) string { return "" })
	if err := root.ParseFlags([]string{"--token-file", filepath.Join(t.TempDir(), "missing")}); err != nil {
		t.Fatal(err)
	}
	if _, err := tokenOf(root); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Errorf("missing token file: %v", err)
	}
}
