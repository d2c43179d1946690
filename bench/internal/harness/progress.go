package harness

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Logf writes one progress line, formatted as fmt.Printf does.
type Logf func(format string, args ...any)

// NewLogf returns a progress logger for the command name: each line goes
// to stderr as "name:  12.3s message", stamped with the seconds since
// NewLogf was called, so stdout holds only the run and BENCH lines.
func NewLogf(name string) Logf { return newLogf(os.Stderr, name, time.Now()) }

func newLogf(w io.Writer, name string, started time.Time) Logf {
	var mu sync.Mutex // one line at a time from concurrent phases
	return func(format string, args ...any) {
		line := fmt.Sprintf("%s: %6.1fs %s\n", name, time.Since(started).Seconds(), fmt.Sprintf(format, args...))
		mu.Lock()
		defer mu.Unlock()
		io.WriteString(w, line)
	}
}

// LoadAvg is the machine's 1, 5 and 15 minute load averages as
// /proc/loadavg gives them ("0.52 0.61 0.70"), or "unknown": the machine
// line of every benchmark, since a shared machine's load moves its figures.
func LoadAvg() string { return loadAvgFrom("/proc/loadavg") }

func loadAvgFrom(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// PollTry is the deadline Poll gives each try, and PollEvery the pause
// between tries.
const (
	PollTry   = 2 * time.Second
	PollEvery = 100 * time.Millisecond
)

// Poll runs try, each time with a PollTry deadline, every PollEvery until
// it succeeds, ctx ends or timeout passes; after each failed try, alive
// (when not nil) says whether waiting on can still succeed, and its error
// ends the poll (a server that exited will not start answering). The
// timeout's error names what did not happen and wraps try's last error.
func Poll(ctx context.Context, timeout time.Duration, what string, alive func() error, try func(context.Context) error) error {
	for deadline := time.Now().Add(timeout); ; {
		tctx, cancel := context.WithTimeout(ctx, PollTry)
		err := try(tctx)
		cancel()
		if err == nil {
			return nil
		}
		if alive != nil {
			if aerr := alive(); aerr != nil {
				return aerr
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s: %w", what, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(PollEvery):
		}
	}
}
