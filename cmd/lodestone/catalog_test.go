package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/server/servertest"
)

// startServer runs a real one-node server for CLI tests of the catalog,
// health, session and lock commands.
func startServer(t *testing.T) map[string]string {
	t.Helper()
	return map[string]string{envEndpoints: servertest.Start(t, nil).GRPCAddr()}
}

func TestCatalogHealthSessionFlow(t *testing.T) {
	t.Parallel()
	env := startServer(t)
	out := cli(t, env, "", "catalog", "register", "web-1", "--address", "10.0.0.1", "--service", "web", "--port", "80",
		"--tag", "v1", "--check", "alive", "--status", "passing").ok(t).stdout
	if !strings.HasPrefix(out, "registered node web-1, service web, check alive at index ") {
		t.Fatalf("catalog register printed %q", out)
	}
	if got := cli(t, env, "", "catalog", "services").ok(t).stdout; got != "SERVICE  TAGS\nweb      v1\n" {
		t.Errorf("catalog services:\n%s", got)
	}
	if got := cli(t, env, "", "catalog", "nodes").ok(t).stdout; got != "NODE   ADDRESS   ID\nweb-1  10.0.0.1  -\n" {
		t.Errorf("catalog nodes:\n%s", got)
	}
	if got := cli(t, env, "", "catalog", "node", "web-1").ok(t).stdout; !strings.Contains(got, "web         web      -        80    v1") {
		t.Errorf("catalog node web-1:\n%s", got)
	}
	cli(t, env, "", "catalog", "node", "nope").failed(t, 1, `node "nope" is not registered`, "lodestone catalog nodes")
	if got := cli(t, env, "", "health", "service", "web", "--passing").ok(t).stdout; !strings.Contains(got, "web-1  10.0.0.1  web         80    passing  1") {
		t.Errorf("health service web --passing:\n%s", got)
	}
	cli(t, env, "", "catalog", "register", "web-1", "--address", "10.0.0.1", "--service", "web", "--port", "80",
		"--tag", "v1", "--check", "alive", "--status", "critical").ok(t)
	if got := cli(t, env, "", "health", "service", "web", "--passing").ok(t).stdout; strings.Contains(got, "web-1") {
		t.Errorf("a critical instance is listed with --passing:\n%s", got)
	}
	if got := cli(t, env, "", "health", "state", "critical").ok(t).stdout; !strings.Contains(got, "web-1  alive  web         critical") {
		t.Errorf("health state critical:\n%s", got)
	}
	cli(t, env, "", "health", "state", "sideways").failed(t, 2, "use any, passing, warning or critical")

	id := strings.TrimSpace(cli(t, env, "", "session", "create", "--node", "web-1", "--ttl", "10s", "--name", "job").ok(t).stdout)
	var sessions []jsonSession
	if err := json.Unmarshal([]byte(cli(t, env, "", "session", "list", "--node", "web-1", "-o", "json").ok(t).stdout), &sessions); err != nil {
		t.Fatal(err)
	}
	if len(sessions) != 1 || sessions[0].ID != id || sessions[0].TTL != "10s" || sessions[0].Name != "job" {
		t.Fatalf("session list -o json = %+v, want the session %s", sessions, id)
	}
	if got := cli(t, env, "", "session", "renew", id).ok(t).stdout; got != "renewed "+id+"\n" {
		t.Errorf("session renew printed %q", got)
	}
	cli(t, env, "", "session", "create", "--node", "ghost").failed(t, 1, `node "ghost" is not registered`)
	cli(t, env, "", "session", "create", "--node", "web-1", "--ttl", "1s").failed(t, 1, "ttl")
	if got := cli(t, env, "", "session", "destroy", id).ok(t).stdout; got != "destroyed "+id+"\n" {
		t.Errorf("session destroy printed %q", got)
	}
	cli(t, env, "", "session", "renew", id).failed(t, 1, "does not exist", "create a new one")
	cli(t, env, "", "session", "info", id).failed(t, 1, "no session "+id)
	if got := cli(t, env, "", "catalog", "deregister", "web-1").ok(t).stdout; got != "removed 1 service(s), 1 check(s); invalidated 0 session(s)\n" {
		t.Errorf("catalog deregister printed %q", got)
	}
}

// Three `lodestone lock` runs on one prefix never overlap: each appends
// "start" and "end" around a pause, and the file alternates.
func TestLockRunsCommandsOneAtATime(t *testing.T) {
	t.Parallel()
	env := startServer(t)
	log := filepath.Join(t.TempDir(), "log")
	script := fmt.Sprintf("echo start >> %s; sleep 0.2; echo end >> %s", log, log)
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cli(t, env, "", "lock", "--node", "locker", "--lock-delay", "0", "jobs", "--", "sh", "-c", script).ok(t)
		}()
	}
	wg.Wait()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), strings.Repeat("start\nend\n", 3); got != want {
		t.Fatalf("the locked commands overlapped:\n%s", got)
	}
	// The command's exit status is lodestone's, and the lock is free after.
	r := cli(t, env, "", "lock", "--node", "locker", "jobs", "--", "sh", "-c", "exit 3")
	if r.code != 3 || !strings.Contains(r.stderr, "exited with status 3") {
		t.Fatalf("lock of a failing command: exit %d, stderr %q", r.code, r.stderr)
	}
	cli(t, env, "", "lock", "--node", "locker", "jobs", "--", "true").ok(t)
	cli(t, env, "", "lock", "jobs").failed(t, 2, "want PREFIX -- COMMAND")
}

func TestCatalogGolden(t *testing.T) {
	t.Parallel()
	node := &lodestonepb.Node{Name: "web-1", Address: "10.0.0.1", Id: "40e4a748-2192-161a-0510-9bf59fe950b5"}
	svc := &lodestonepb.Service{Id: "web-a", Name: "web", Node: "web-1", Port: 8080, Tags: []string{"v1", "blue"}}
	checks := []*lodestonepb.Check{
		{Node: "web-1", CheckId: "serfHealth", Name: "Serf", Status: lodestonepb.HealthStatus_HEALTH_PASSING},
		{Node: "web-1", CheckId: "web-alive", Name: "alive", Status: lodestonepb.HealthStatus_HEALTH_CRITICAL, ServiceId: "web-a", Output: "connection\nrefused"},
	}
	hs := []*lodestonepb.ServiceHealth{{Node: node, Service: svc, Checks: checks, Status: lodestonepb.HealthStatus_HEALTH_CRITICAL}}
	sessions := []*lodestonepb.SessionEntry{{Id: "adf4238a-882b-9ddc-4a9d-5b6758e4159e", Name: "job", Node: "web-1",
		Ttl: durationpb.New(10 * time.Second), LockDelay: durationpb.New(15 * time.Second), Checks: []string{"serfHealth"}, CreateIndex: 12}}
	for _, tc := range []struct {
		command string
		render  func(w *bytes.Buffer, format string) error
	}{
		{"catalog-services", func(w *bytes.Buffer, f string) error {
			return renderServices(w, f, []*lodestonepb.ServiceSummary{{Name: "db"}, {Name: "web", Tags: []string{"blue", "v1"}}})
		}},
		{"catalog-nodes", func(w *bytes.Buffer, f string) error { return renderNodes(w, f, []*lodestonepb.Node{node}) }},
		{"catalog-node", func(w *bytes.Buffer, f string) error {
			return renderNode(w, f, &lodestonepb.NodeServices{Node: node, Services: []*lodestonepb.Service{svc}})
		}},
		{"health-service", func(w *bytes.Buffer, f string) error { return renderHealth(w, f, hs) }},
		{"health-checks", func(w *bytes.Buffer, f string) error { return renderChecks(w, f, checks) }},
		{"session-list", func(w *bytes.Buffer, f string) error { return renderSessions(w, f, sessions) }},
	} {
		for _, format := range []string{outputTable, outputJSON} {
			var b bytes.Buffer
			if err := tc.render(&b, format); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.command, format, b.Bytes())
		}
	}
}
