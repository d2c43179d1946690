package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/lodestone-kv/lodestone/internal/buildinfo"
)

// What stampedBinary stamps in, as the Makefile's LDFLAGS would.
const (
	stampVersion = "v9.8.7-test"
	stampCommit  = "0123456789abcdef0123456789abcdef01234567"
	stampDate    = "2026-11-28T04:10:58Z"
)

// stampedBinary builds this command with -ldflags setting the buildinfo
// variables, exactly as `make build` does, and returns its path.
func stampedBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "lodestone")
	pkg := "github.com/lodestone-kv/lodestone/internal/buildinfo"
	ldflags := "-X " + pkg + ".version=" + stampVersion + " -X " + pkg + ".commit=" + stampCommit + " -X " + pkg + ".date=" + stampDate
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func TestVersionOfAStampedBinary(t *testing.T) {
	t.Parallel()
	bin := stampedBinary(t)
	goVersion := runtime.Version() // NB: the test and the binary share the toolchain
	platform := runtime.GOOS + "/" + runtime.GOARCH

	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("lodestone version: %v", err)
	}
	for _, want := range []string{"version   " + stampVersion, "commit    " + stampCommit, "built     " + stampDate,
		"go        " + goVersion, "platform  " + platform} {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("lodestone version printed\n%s\nwant a line %q", out, want)
		}
	}

	out, err = exec.Command(bin, "version", "-o", "json").Output()
	if err != nil {
		t.Fatalf("lodestone version -o json: %v", err)
	}
	var got buildinfo.Info
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("-o json printed %q: %v", out, err)
	}
	want := buildinfo.Info{Version: stampVersion, Commit: stampCommit, Date: stampDate, GoVersion: goVersion,
		OS: runtime.GOOS, Arch: runtime.GOARCH}
	if got != want {
		t.Errorf("-o json = %+v, want %+v", got, want)
	}

	out, err = exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("lodestone --version: %v", err)
	}
	if line := "lodestone " + want.String() + "\n"; string(out) != line {
		t.Errorf("--version printed %q, want %q", out, line)
	}
}

// TestVersionUnstamped: a plain build (go run, go test) still answers,
// with the fallbacks and the real Go version, and refuses a bad format.
func TestVersionUnstamped(t *testing.T) {
	t.Parallel()
	out := cli(t, nil, "", "version", "-o", "json").ok(t).stdout
	var got buildinfo.Info
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-o json printed %q: %v", out, err)
	}
	if got != buildinfo.Get() || got.GoVersion != runtime.Version() || got.Version == "" || got.Commit == "" {
		t.Errorf("-o json = %+v, want %+v with Go %s", got, buildinfo.Get(), runtime.Version())
	}
	cli(t, nil, "", "version", "-o", "yaml").failed(t, 2, `--output "yaml": use table or json`)
	cli(t, nil, "", "version", "extra").failed(t, 2, `unknown command or argument "extra"`)
}
