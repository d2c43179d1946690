package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The drill runs its clients and watchers in a child process of its own
// binary (drill -serve-population), pinned to --client-cpus: thousands of
// client goroutines sharing a process with the drill's clock, scrapes and
// readiness polls delayed them by seconds. The parent drives the child
// with one line per command on the child's stdin and reads one line per
// answer on its stdout:
//
//	child:  ready                          (once, when every client and watcher started)
//	parent: served <unix-nanos> <index>    child: served <clients> <watchers>
//	                                       (clients with a success after the time,
//	                                        watchers at or past the index)
//	parent: stop                           child: stopped (then it exits)
//
// A line the child does not understand gets "error <why>" and changes
// nothing. The child stops when its stdin closes (the parent died) and is
// killed with the parent (Pdeathsig). Its stderr is the parent's.

// servePopulation is the child: it runs the fleet and answers the parent
// until "stop" or the end of in.
func servePopulation(ctx context.Context, o options, eps []string, in io.Reader, out io.Writer) error {
	f, err := startFleet(ctx, eps, o)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		f.stop()
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		reply, stop := answer(f, sc.Text())
		if stop {
			f.stop()
		}
		if _, err := fmt.Fprintln(out, reply); err != nil || stop {
			if !stop {
				f.stop()
			}
			return err
		}
	}
	f.stop()
	return sc.Err()
}

// answer is the child's reply to one command line, and whether to stop.
func answer(f *fleet, line string) (reply string, stop bool) {
	fields := strings.Fields(line)
	switch {
	case len(fields) == 1 && fields[0] == "stop":
		return "stopped", true
	case len(fields) == 3 && fields[0] == "served":
		nanos, err1 := strconv.ParseInt(fields[1], 10, 64)
		index, err2 := strconv.ParseUint(fields[2], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return "error bad served arguments: " + strings.ReplaceAll(err.Error(), "\n", "; "), false
		}
		cl, wa := f.served(time.Unix(0, nanos), index)
		return fmt.Sprintf("served %d %d", cl, wa), false
	default:
		return fmt.Sprintf("error unknown command %q (want: served <unix-nanos> <index> | stop)", line), false
	}
}

// population is the parent's handle on the child process.
type population struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	mu   sync.Mutex // one command and its answer at a time
	done chan struct{}
}

// startPopulation starts the child with o's fleet on eps and waits until
// it reports ready.
func startPopulation(eps []string, o options) (*population, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"-serve-population", "-endpoints", strings.Join(eps, ","),
		"-clients", strconv.Itoa(o.clients), "-watchers", strconv.Itoa(o.watchers),
		"-keys", strconv.Itoa(o.keys), "-interval", o.interval.String(), "-client-cpus", o.clientCPUs}
	p := &population{cmd: exec.Command(self, args...), done: make(chan struct{})}
	p.cmd.Stderr = os.Stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.out = bufio.NewScanner(stdout)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the population: %w", err)
	}
	go func() {
		defer close(p.done)
		_ = p.cmd.Wait()
	}()
	if line, err := p.read(); err != nil || line != "ready" {
		p.kill()
		return nil, fmt.Errorf("the population did not start: %q %v", line, err)
	}
	return p, nil
}

func (p *population) read() (string, error) {
	if p.out.Scan() {
		return p.out.Text(), nil
	}
	if err := p.out.Err(); err != nil {
		return "", err
	}
	return "", io.ErrUnexpectedEOF
}

// ask sends one command and returns the answer's fields after want.
func (p *population) ask(cmd, want string) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		return nil, fmt.Errorf("population: %s: %w", cmd, err)
	}
	line, err := p.read()
	if err != nil {
		return nil, fmt.Errorf("population: %s: %w", cmd, err)
	}
	fields := strings.Fields(line)
	if len(fields) == 0 || fields[0] != want {
		return nil, fmt.Errorf("population: %s: answered %q", cmd, line)
	}
	return fields[1:], nil
}

// served counts the child's clients with a success after t and watchers
// at or past index.
func (p *population) served(t time.Time, index uint64) (clients, watchers int, err error) {
	f, err := p.ask(fmt.Sprintf("served %d %d", t.UnixNano(), index), "served")
	if err != nil {
		return 0, 0, err
	}
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("population: served answered %q", f)
	}
	if clients, err = strconv.Atoi(f[0]); err != nil {
		return 0, 0, err
	}
	watchers, err = strconv.Atoi(f[1])
	return clients, watchers, err
}

// cpu is the child's CPU time so far (user and system), from /proc.
func (p *population) cpu() (time.Duration, error) {
	return processCPU(p.cmd.Process.Pid)
}

// stop asks the child to stop and waits for it, killing it if it does
// not end within 30 s.
func (p *population) stop() {
	_, _ = p.ask("stop", "stopped")
	p.in.Close()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.kill()
	}
}

func (p *population) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// processCPU reads utime+stime of pid from /proc/<pid>/stat.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name is in parentheses and may hold spaces: fields
	// count from after its closing one (utime and stime are fields 14
	// and 15, the 12th and 13th after it).
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	// USER_HZ is 100 on every Linux the drill runs on.
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
