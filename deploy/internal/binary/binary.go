// Package binary builds the lodestone binary of the repository the deploy
// module sits in, once per test process, for the tests that run it.
package binary

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	once sync.Once
	dir  string
	err  error
)

// Lodestone returns the path of a lodestone binary built from
// cmd/lodestone, building it on the first call; it fails t if the build
// failed.
func Lodestone(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		if dir, err = os.MkdirTemp("", "lodestone-deploy-"); err != nil {
			return
		}
		_, self, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "lodestone"), "./cmd/lodestone")
		cmd.Dir = filepath.Join(filepath.Dir(self), "..", "..", "..") // the repository's root
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("go build ./cmd/lodestone: %v\n%s", berr, out)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "lodestone")
}

// Main runs m and removes the binary afterwards: call it from TestMain.
func Main(m *testing.M) int {
	code := m.Run()
	if dir != "" {
		os.RemoveAll(dir)
	}
	return code
}
