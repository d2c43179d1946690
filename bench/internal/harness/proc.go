package harness

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Proc is one server process started by Start.
type Proc struct {
	Name    string
	LogPath string // combined stdout and stderr of the process
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has been reaped
	err     error         // Wait's result; valid after done is closed
}

// Start runs bin with args as a child process whose stdout and stderr go to
// logPath. When cpus is not empty the process runs under `taskset -c cpus`.
//
// The child gets its own process group, so a Ctrl-C in the terminal reaches
// only the benchmark, which then stops its children in order (Stop); and it
// is killed by the kernel if the benchmark dies without stopping it
// (Pdeathsig), so no server outlives a crashed run.
func Start(name, bin string, args []string, logPath, cpus string) (*Proc, error) {
	return start(name, bin, args, logPath, cpus, nil, nil)
}

// start is Start with the child's stdin and stdout (nil: none, and the log).
func start(name, bin string, args []string, logPath, cpus string, stdin, stdout *os.File) (*Proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create log for %s: %w", name, err)
	}
	defer logf.Close() // the child holds its own descriptor
	if cpus != "" {
		args = append([]string{"-c", cpus, bin}, args...)
		bin = "taskset"
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logf
	if stdout != nil {
		cmd.Stdout = stdout
	}
	if stdin != nil {
		cmd.Stdin = stdin
	}
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Exited reports whether the process has already exited, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM and waits up to grace for the process to exit, then
// sends SIGKILL and waits for it to be reaped. It is safe to call twice. An
// exit caused by our own signal is not an error.
func (p *Proc) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s did not exit within %s of SIGTERM; killed", p.Name, grace)
}

// StopAll stops every process in parallel and returns the first error.
func StopAll(ps []*Proc, grace time.Duration) error {
	errs := make(chan error, len(ps))
	for _, p := range ps {
		go func() { errs <- p.Stop(grace) }()
	}
	var first error
	for range ps {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// StopLeaderLast stops every process but ps[leader] in parallel, then
// ps[leader] (leader < 0: all at once), and returns the first error. NB: a
// leader stopped while its followers are up tries to hand leadership over
// first (etcd waits seconds for followers that are themselves shutting
// down), which only slows a benchmark down.
func StopLeaderLast(ps []*Proc, leader int, grace time.Duration) error {
	var rest, last []*Proc
	for i, p := range ps {
		if i == leader {
			last = append(last, p)
		} else {
			rest = append(rest, p)
		}
	}
	err := StopAll(rest, grace)
	if lerr := StopAll(last, grace); lerr != nil && err == nil {
		err = lerr
	}
	return err
}

// LogTails returns the last n bytes of every process's log, each under a
// heading naming it (prefixed by label when not empty), for error messages.
func LogTails(label string, ps []*Proc, n int) string {
	if label != "" {
		label += " "
	}
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "\n--- last lines of %s%s log (%s):\n%s", label, p.Name, p.LogPath, p.LogTail(n))
	}
	return b.String()
}

// LogTail returns up to the last n bytes of the process's log, for error
// messages.
func (p *Proc) LogTail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// ErrExited is returned (wrapped) by callers that find a server gone while
// waiting for it.
var ErrExited = errors.New("harness: process exited")
