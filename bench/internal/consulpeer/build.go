package consulpeer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Version is the Consul release the benchmarks compare against: the last
// under MPL-2.0. Do not raise it: 1.16.4 and later are under the BSL.
const Version = "v1.16.3"

// consulModule is the module whose root package is the consul binary.
const consulModule = "github.com/hashicorp/consul"

// nested are the modules Version's go.mod replaces with local
// directories, which its module zip lacks: directory -> version.
var nested = map[string]string{
	"api":             "v1.25.1",
	"envoyextensions": "v0.4.1",
	"proto-public":    "v0.4.1",
	"sdk":             "v0.14.1",
	"troubleshoot":    "v0.3.1",
}

// noSumDB is the module the checksum database cannot vouch for.
const noSumDB = consulModule + "/envoyextensions"

// CacheEnv names the environment variable that moves the cache.
const CacheEnv = "LODESTONE_BENCH_CACHE"

// CacheDir is where Binary keeps the build: $LODESTONE_BENCH_CACHE, else
// the user's cache directory, under lodestone-bench/consul-<version>.
func CacheDir() (string, error) {
	root := os.Getenv(CacheEnv)
	if root == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("find a cache directory (set %s): %w", CacheEnv, err)
		}
		root = filepath.Join(c, "lodestone-bench")
	}
	return filepath.Join(root, "consul-"+strings.TrimPrefix(Version, "v")), nil
}

// Cached returns the path of a cached binary that reports Version, or ""
// when there is none.
func Cached(ctx context.Context) (string, error) {
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "consul")
	if _, err := os.Stat(bin); err != nil {
		return "", nil
	}
	if err := CheckVersion(ctx, bin); err != nil {
		return "", nil
	}
	return bin, nil
}

// Binary returns the path of a consul binary of Version, building it into
// CacheDir first when no usable one is there. logf gets its progress.
func Binary(ctx context.Context, logf func(string, ...any)) (string, error) {
	if bin, err := Cached(ctx); err != nil || bin != "" {
		if bin != "" {
			logf("consul %s: using %s", Version, bin)
		}
		return bin, err
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	t0 := time.Now()
	logf("consul %s: not in the cache; building it into %s (a cold build takes minutes and about 2 GB)", Version, dir)
	src := filepath.Join(dir, "src")
	if err := prepareSource(ctx, logf, src); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "consul")
	if err := build(ctx, logf, src, bin); err != nil {
		return "", err
	}
	if err := CheckVersion(ctx, bin); err != nil {
		return "", err
	}
	// The copy of the source has served; the compile cache keeps the
	// work for a rebuild.
	if err := os.RemoveAll(src); err != nil {
		return "", err
	}
	logf("consul %s: built in %.0fs", Version, time.Since(t0).Seconds())
	return bin, nil
}

// prepareSource lays out a writable copy of the consul module at src with
// each nested module copied into its directory.
func prepareSource(ctx context.Context, logf func(string, ...any), src string) error {
	if err := os.RemoveAll(src); err != nil {
		return err
	}
	mod, err := download(ctx, consulModule, Version)
	if err != nil {
		return err
	}
	logf("consul %s: copying %s to %s", Version, mod, src)
	if err := os.CopyFS(src, os.DirFS(mod)); err != nil {
		return fmt.Errorf("copy %s: %w", mod, err)
	}
	for sub, v := range nested {
		dir, err := download(ctx, consulModule+"/"+sub, v)
		if err != nil {
			return err
		}
		logf("consul %s: nested module %s %s into place", Version, sub, v)
		if err := os.CopyFS(filepath.Join(src, sub), os.DirFS(dir)); err != nil {
			return fmt.Errorf("copy %s: %w", dir, err)
		}
	}
	return nil
}

// download fetches module@version through the module proxy and returns
// its directory in the module cache.
func download(ctx context.Context, module, version string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module+"@"+version)
	cmd.Env = goEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	// NB: on failure go mod download -json still prints the JSON, with
	// an Error field.
	dir, perr := parseDownload(out)
	if err != nil || perr != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w %s", module, version, errors.Join(err, perr), strings.TrimSpace(stderr.String()))
	}
	return dir, nil
}

// parseDownload takes the module directory out of `go mod download -json`.
func parseDownload(out []byte) (string, error) {
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", fmt.Errorf("parse go mod download output: %w", err)
	}
	if m.Error != "" {
		return "", errors.New(m.Error)
	}
	if m.Dir == "" {
		return "", errors.New("go mod download gave no directory")
	}
	return m.Dir, nil
}

// goEnv is the environment of every go command here: the local toolchain
// (no toolchain download), no workspace, pure Go, and no checksum-database
// lookup for the one module it cannot answer for.
func goEnv() []string {
	return append(os.Environ(), "GOTOOLCHAIN=local", "GOWORK=off", "CGO_ENABLED=0",
		"GONOSUMDB="+noSumDB, "GOFLAGS=-mod=mod -buildvcs=false")
}

// build compiles the consul binary in src to bin, through a temporary
// file so an interrupted build leaves no binary, logging every
// progressEvery packages compiled.
func build(ctx context.Context, logf func(string, ...any), src, bin string) error {
	tmp := bin + ".tmp"
	cmd := exec.CommandContext(ctx, "go", "build", "-v", "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = goEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("go build consul: %w", err)
	}
	tail := logProgress(stderr, func(n int, pkg string) {
		logf("consul %s: %d packages compiled (%s)", Version, n, pkg)
	})
	if err := cmd.Wait(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("go build consul in %s: %w\n%s", src, err, tail())
	}
	return os.Rename(tmp, bin)
}

// progressEvery is how many compiled packages make one progress line.
const progressEvery = 100

// logProgress reads go build -v output from r until it ends, calling
// progress every progressEvery package lines, and returns a func giving
// the last lines read (the error, when the build fails).
func logProgress(r io.Reader, progress func(n int, pkg string)) func() string {
	var last []string
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		last = append(last, line)
		if len(last) > 40 {
			last = last[1:]
		}
		if strings.HasPrefix(line, "go: ") || strings.HasPrefix(line, "#") || strings.Contains(line, " ") {
			continue // not a package path
		}
		if n++; n%progressEvery == 0 {
			progress(n, line)
		}
	}
	return func() string { return strings.Join(last, "\n") }
}

// CheckVersion fails unless bin's `consul version` names Version.
func CheckVersion(ctx context.Context, bin string) error {
	out, err := exec.CommandContext(ctx, bin, "version").Output()
	if err != nil {
		return fmt.Errorf("%s version: %w", bin, err)
	}
	if got := parseVersion(out); got != Version {
		return fmt.Errorf("%s reports version %q, want %s", bin, got, Version)
	}
	return nil
}

// parseVersion takes "v1.16.3" out of `consul version`'s first line,
// "Consul v1.16.3"; a pre-release or metadata suffix is kept.
func parseVersion(out []byte) string {
	first, _, _ := bytes.Cut(out, []byte("\n"))
	v, ok := strings.CutPrefix(strings.TrimSpace(string(first)), "Consul ")
	if !ok {
		return ""
	}
	return v
}
