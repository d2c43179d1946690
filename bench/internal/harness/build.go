package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// GoBuild builds pkg in dir into out, showing the compiler's output, and
// logs that it does through logf. It then flushes every dirty page on the
// machine to disk and waits for that: a build leaves tens of MB dirty
// (the binary, the build cache), which the kernel writes back about 30 s
// later (vm.dirty_expire_centisecs), in the middle of a measured phase.
// The servers' fdatasyncs then wait behind it, all three at once, for
// 10-40 ms.
func GoBuild(ctx context.Context, logf func(string, ...any), dir, out, pkg string) error {
	logf("building %s (in %s)", pkg, dir)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build -o %s %s in %s: %w", out, pkg, dir, err)
	}
	syscall.Sync()
	return nil
}
