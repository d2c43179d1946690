package consulpeer

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// The release must stay under MPL-2.0: 1.16.4 and later are under the BSL.
func TestVersionIsMPL(t *testing.T) {
	var major, minor, patch int
	if n, err := fmt.Sscanf(Version, "v%d.%d.%d", &major, &minor, &patch); n != 3 || err != nil || strings.ContainsAny(Version, "-+") {
		t.Fatalf("Version = %q, not a release vMAJOR.MINOR.PATCH", Version)
	}
	if major > 1 || major == 1 && (minor > 16 || minor == 16 && patch > 3) {
		t.Errorf("Version = %s; only v1.16.3 and earlier are under MPL-2.0", Version)
	}
}

func TestParseVersion(t *testing.T) {
	for out, want := range map[string]string{
		"Consul v1.16.3\nRevision \nBuild Date 1970-01-01T00:00:01Z\nProtocol 2 spoken by default\n": "v1.16.3",
		"Consul v1.16.4-dev\n":        "v1.16.4-dev",
		"Consul v1.16.3":              "v1.16.3",
		"consul: command not found\n": "",
		"":                            "",
	} {
		if got := parseVersion([]byte(out)); got != want {
			t.Errorf("parseVersion(%q) = %q, want %q", out, got, want)
		}
	}
}

func TestParseDownload(t *testing.T) {
	dir, err := parseDownload([]byte(`{"Path":"github.com/hashicorp/consul/sdk","Version":"v0.14.1","Dir":"/m/sdk@v0.14.1"}`))
	if err != nil || dir != "/m/sdk@v0.14.1" {
		t.Errorf("parseDownload = %q, %v", dir, err)
	}
	for _, bad := range []string{
		`{"Path":"x","Error":"verifying module: checksum mismatch"}`,
		`{"Path":"x"}`,
		`not json`,
	} {
		if _, err := parseDownload([]byte(bad)); err == nil {
			t.Errorf("parseDownload(%s) succeeded", bad)
		}
	}
}

func TestLogProgress(t *testing.T) {
	var lines []string
	for i := range 250 {
		lines = append(lines, "example.com/pkg"+strings.Repeat("x", i%3)+string(rune('a'+i%26)))
		if i == 10 {
			lines = append(lines, "go: downloading example.com/y v1.0.0", "# example.com/broken", "./a.go:1:1: syntax error")
		}
	}
	var got []int
	tail := logProgress(strings.NewReader(strings.Join(lines, "\n")), func(n int, pkg string) { got = append(got, n) })
	if !slices.Equal(got, []int{100, 200}) {
		t.Errorf("progress at %v, want [100 200]", got)
	}
	if !strings.HasSuffix(tail(), lines[len(lines)-1]) {
		t.Errorf("tail does not end with the last line: %q", tail())
	}
}

func TestAgentArgs(t *testing.T) {
	lan := []string{"127.0.0.1:3", "127.0.0.1:13", "127.0.0.1:23"}
	args := agentArgs("n2", "/d/n2", 3, []int{11, 12, 13, 14}, lan, Options{Extra: []string{"-hcl", "x = 1"}})
	s := strings.Join(args, " ")
	for _, want := range []string{"agent -server -bootstrap-expect 3", "-node n2 -data-dir /d/n2", "-http-port 11 -server-port 12 -serf-lan-port 13 -serf-wan-port 14",
		"-retry-join 127.0.0.1:3 -retry-join 127.0.0.1:23", "-log-level warn", "-hcl x = 1"} {
		if !strings.Contains(s, want) {
			t.Errorf("args %q lack %q", s, want)
		}
	}
	if strings.Contains(s, "-dev") || strings.Contains(s, "127.0.0.1:13 ") {
		t.Errorf("args %q: dev mode or a join of itself", s)
	}
}

func TestCacheDir(t *testing.T) {
	t.Setenv(CacheEnv, "/c")
	if dir, err := CacheDir(); err != nil || dir != "/c/consul-1.16.3" {
		t.Errorf("CacheDir() = %q, %v", dir, err)
	}
}

// TestCluster starts a real three-server cluster of the cached binary
// and round-trips a key. Opt in with CONSULPEER_SMOKE=1 after a build
// (make bench-consul makes one); without the binary it fails.
func TestCluster(t *testing.T) {
	if os.Getenv("CONSULPEER_SMOKE") != "1" {
		t.Skip("opt-in: CONSULPEER_SMOKE=1 runs three Consul servers from the cache")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin, err := Cached(ctx)
	if err != nil || bin == "" {
		t.Fatalf("no cached consul %s (%v): run make bench-consul once", Version, err)
	}
	c, err := StartCluster(ctx, bin, t.TempDir(), Options{Members: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(false); err != nil {
			t.Error(err)
		}
	}()
	if err := Put(ctx, http.DefaultClient, c.HTTP[c.Leader], "smoke/k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	// A follower reads it back in the default mode (forwarded to the
	// leader), so the three are one cluster.
	var got []struct{ Value []byte }
	if err := GetJSON(ctx, c.HTTP[(c.Leader+1)%3]+"/v1/kv/smoke/k", &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || string(got[0].Value) != "v1" {
		t.Errorf("read back %+v, want one entry v1", got)
	}
	var peers []string
	if err := GetJSON(ctx, c.HTTP[0]+"/v1/status/peers", &peers); err != nil || len(peers) != 3 {
		t.Errorf("status/peers = %v, %v; want 3", peers, err)
	}
}
