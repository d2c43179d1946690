package harness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// LoadHeapFloor is the GC heap floor of a load generator that holds many
// clients (heapfloor.Start): blockingbench's 10k queries keep about
// 150 MB live in 30k goroutines and their connections, and with GOGC alone
// each cycle marked for about half a second on its one CPU; the answers
// that came in meanwhile were read late, so the wake p99 measured the load
// generator, not the servers.
const LoadHeapFloor = 2 << 30

// Main is a benchmark command's main: it parses the flags, runs run with
// a context that SIGINT and SIGTERM cancel, and exits 1 with one line on
// stderr if run fails (cleaned, saying what interrupted means for it, when
// it was interrupted). program names the command in usage and errors.
//
// The first signal cancels run's context, so run stops what it started
// and removes its files; a second one ends the process at once, and the
// processes it started with it (Start's Pdeathsig): a cleanup that
// hangs is never the only way out.
func Main(program, cleaned string, run func(context.Context) error) {
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: cd bench && go run ./cmd/%s [flags]\n\n", program)
		flag.PrintDefaults()
	}
	flag.Parse()
	ctx, cancel := context.WithCancel(context.Background())
	stop := cancelOnSignal(program, cancel, os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err == nil {
		return
	}
	if errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "%s: interrupted; %s\n", program, cleaned)
	} else {
		fmt.Fprintf(os.Stderr, "%s: %v\n", program, err)
	}
	os.Exit(1)
}

// cancelOnSignal calls cancel on the first of sigs and then gives them
// back their default action; stop ends the watch.
func cancelOnSignal(program string, cancel context.CancelFunc, sigs ...os.Signal) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			signal.Reset(sigs...)
			fmt.Fprintf(os.Stderr, "%s: %v: stopping what it started (again to exit at once)\n", program, s)
			cancel()
		case <-done:
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
		cancel()
	}
}
