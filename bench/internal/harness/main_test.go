package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mainChildEnv makes the test binary a benchmark under Main whose run
// waits for its context to end, then returns ("clean") or hangs in its
// cleanup ("hang").
const mainChildEnv = "HARNESS_TEST_MAIN_CHILD"

func runMainChild(mode string) {
	Main("testbench", "cleaned up", func(ctx context.Context) error {
		fmt.Println("ready")
		<-ctx.Done()
		if mode == "hang" {
			time.Sleep(time.Hour) // a cleanup that does not end
		}
		return ctx.Err()
	})
	os.Exit(0)
}

// mainChild is the test binary running as a benchmark under Main.
type mainChild struct {
	cmd    *exec.Cmd
	stderr chan string   // its lines, closed at its end
	exited chan struct{} // closed once Wait returned, with err
	err    error
}

// startMainChild starts the test binary as a benchmark in mode and waits
// until its run has begun (its signal handling is in place by then).
func startMainChild(t *testing.T, mode string) *mainChild {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), mainChildEnv+"="+mode)
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = errW
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	errW.Close()
	c := &mainChild{cmd: cmd, stderr: make(chan string, 16), exited: make(chan struct{})}
	go func() {
		defer close(c.stderr)
		defer errR.Close()
		sc := bufio.NewScanner(errR)
		for sc.Scan() {
			c.stderr <- sc.Text()
		}
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		cmd.Process.Kill()
		t.Fatalf("child said %q, %v; want ready", line, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.exited
		for range c.stderr {
		}
	})
	return c
}

// expectLine waits (up to 10 s) for a line of the child's stderr holding
// want.
func (c *mainChild) expectLine(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case line, ok := <-c.stderr:
			if !ok {
				t.Fatalf("stderr ended without %q", want)
			}
			if strings.Contains(line, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no stderr line with %q within 10s", want)
		}
	}
}

// The first SIGINT cancels run's context; run returns and Main says the
// run was interrupted and cleaned up.
func TestMainInterrupted(t *testing.T) {
	c := startMainChild(t, "clean")
	if err := c.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	c.expectLine(t, "testbench: interrupt: stopping what it started (again to exit at once)")
	c.expectLine(t, "testbench: interrupted; cleaned up")
	<-c.exited
	err := c.err
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1", err)
	}
}

// A second SIGINT ends a run whose cleanup hangs: the signal's default
// action is back once the first has been taken.
func TestMainSecondInterruptExits(t *testing.T) {
	c := startMainChild(t, "hang")
	if err := c.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	// NB: the line comes after the handler gave the signal back.
	c.expectLine(t, "again to exit at once")
	select {
	case <-c.exited:
		t.Fatalf("exited after one SIGINT (%v), want it hanging in its cleanup", c.err)
	default:
	}
	if err := c.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	<-c.exited
	err := c.err
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("exit: %v", err)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Errorf("exit %v, want killed by SIGINT", err)
	}
}
