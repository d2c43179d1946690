package main

import (
	"bytes"
	"context"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client/clienttest"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// golden compares got with testdata/<command>/<name>/stdout (rewritten
// with -update; commit the diff only if you can explain it).
func golden(t *testing.T, command, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", command, name, "stdout")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run with -update to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (rerun with -update to accept):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// result is what one CLI invocation left behind.
type result struct {
	code           int
	stdout, stderr string
}

// cli runs the lodestone command line with env as its environment.
func cli(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(stdin), &out, &errb, func(k string) string { return env[k] })
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// ok fails the test unless r succeeded.
func (r result) ok(t *testing.T) result {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exit %d, stderr: %s", r.code, r.stderr)
	}
	return r
}

// failed checks the exit code and that stderr is exactly one line in the
// documented shape, containing every one of wants.
func (r result) failed(t *testing.T, code int, wants ...string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit = %d, want %d (stderr %q)", r.code, code, r.stderr)
	}
	if n := strings.Count(r.stderr, "\n"); n != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Errorf("stderr has %d lines, want exactly one: %q", n, r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "lodestone: ") {
		t.Errorf("stderr %q does not start with %q", r.stderr, "lodestone: ")
	}
	for _, w := range wants {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr %q does not contain %q", r.stderr, w)
		}
	}
}

// startMemory serves an in-memory one-node cluster for CLI tests.
func startMemory(t *testing.T) (*clienttest.Server, map[string]string) {
	t.Helper()
	m := clienttest.NewMemory(&lodestonepb.Member{Name: "n1", PeerAddr: "127.0.0.1:7401", HttpAddr: "127.0.0.1:8500"})
	s := clienttest.Start(t, m.Funcs())
	return s, map[string]string{envEndpoints: s.Addr}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"bogus"}, `unknown command "bogus"`},
		{"unknown kv command", []string{"kv", "bogus"}, `kv: unknown command "bogus"`},
		{"missing argument", []string{"kv", "put", "k"}, "want KEY VALUE"},
		{"unknown flag", []string{"kv", "get", "k", "--nope"}, "unknown flag: --nope"},
		{"bad output", []string{"kv", "list", "-o", "yaml"}, `--output "yaml": use table or json`},
		{"bad timeout", []string{"--timeout", "0s", "members"}, "--timeout must be positive"},
		{"cas with prefix", []string{"kv", "delete", "p/", "--prefix", "--cas", "3"}, "--cas cannot be combined with --prefix"},
		{"add without peer", []string{"members", "add", "n2"}, "--peer is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cli(t, nil, "", tc.args...).failed(t, 2, tc.want, "--help")
		})
	}
}

func TestServerRefusesANegativeHeapFloor(t *testing.T) {
	t.Parallel()
	cli(t, nil, "", "server", "--data-dir", t.TempDir(), "--gc-heap-floor-mib", "-1").
		failed(t, 1, "--gc-heap-floor-mib -1: use 0 (off) or a size in MiB")
}

func TestHelpSucceeds(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{}, {"--help"}, {"kv"}, {"kv", "put", "--help"}, {"members", "--help"}, {"status", "--help"}} {
		r := cli(t, nil, "", args...).ok(t)
		if !strings.Contains(r.stdout, "Usage:") {
			t.Errorf("lodestone %v printed no usage: %q", args, r.stdout)
		}
	}
}

// TestNoServer: with nothing listening, a command fails fast with one line
// that names the endpoint and says how to start a server.
func TestNoServer(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	r := cli(t, nil, "", "--endpoints", addr, "kv", "get", "greeting")
	r.failed(t, 1, addr, "lodestone dev", "--endpoints")
}
