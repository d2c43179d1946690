// Package browser drives the web UIs in a real headless Chromium (Debian's
// chromium, through chromedp) against a real three-server cluster and a
// gateway, run as processes of the built binary: every page renders with
// live data, a KV edit made in the UI is read back through the API, a
// member killed with SIGKILL shows as unreachable within 5 s, and with
// ACLs on a restricted token sees only its keys. A screenshot of each page
// is written to $LODESTONE_UI_SCREENSHOTS (default: a temporary directory,
// named in the test log).
package browser

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lodestone-browser-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "browser: temp dir:", err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "lodestone")
	build := exec.Command("go", "build", "-o", binary, "github.com/lodestone-kv/lodestone/cmd/lodestone")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "browser: build lodestone:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
