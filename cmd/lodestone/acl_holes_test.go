package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/server"
	"github.com/lodestone-kv/lodestone/server/servertest"
)

// TestACLClosesTheHoles runs, against a real server with ACLs on and
// default deny, each command that used to work for anyone who could reach
// the port. Each now fails with one line that names the missing
// permission (or the unknown token), and a read with no rights to spare
// shows nothing changed.
func TestACLClosesTheHoles(t *testing.T) {
	srv := servertest.Start(t, func(c *server.Config) {
		c.ACL = acl.Config{Enabled: true, DefaultPolicy: acl.AccessDeny}
	})
	env := map[string]string{envEndpoints: srv.GRPCAddr()}
	// The member's own bootstrap must be applied before counting members.
	for deadline := time.Now().Add(10 * time.Second); len(srv.Store().Members()) != 1; {
		if time.Now().After(deadline) {
			t.Fatal("the member never applied its own bootstrap")
		}
		time.Sleep(10 * time.Millisecond)
	}
	bogus := map[string]string{envEndpoints: srv.GRPCAddr(), envToken: "not-a-token"}

	cli(t, bogus, "", "kv", "put", "app/db-password", "hunter2").failed(t, 1, "ACL not found")
	if kv, _ := srv.Store().Get([]byte("app/db-password")); kv != nil {
		t.Fatal("a put with a bogus token was applied")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"kv", "put", "app/db-password", "hunter2"}, "key:write"},
		{[]string{"snapshot", "save", filepath.Join(t.TempDir(), "all-secrets.snap")}, "acl:write"},
		{[]string{"catalog", "deregister", "some-node"}, "node:write"},
		{[]string{"session", "destroy", "00000000-0000-0000-0000-000000000009"}, "session:write"},
		{[]string{"admission", "set", "--writes", "1"}, "operator:write"},
		{[]string{"members", "add", "evil", "--peer", "127.0.0.1:1", "--grpc", "127.0.0.1:2", "--http", "127.0.0.1:3"}, "operator:write"},
	} {
		cli(t, env, "", tc.args...).failed(t, 1, "Permission denied", tc.want)
	}
	if kv, _ := srv.Store().Get([]byte("app/db-password")); kv != nil {
		t.Fatal("a denied put was applied")
	}
	if p, _ := srv.Store().Admission(); p != nil && p.Enabled {
		t.Fatal("a denied admission set was applied")
	}
	if n := len(srv.Store().Members()); n != 1 {
		t.Fatalf("%d members after a denied add, want 1", n)
	}
}
