package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/lodestone-kv/lodestone/server"
)

// sdNotifier tells a service manager (systemd, Type=notify; sd_notify(3))
// how a server or a gateway is doing, over the datagram socket named by
// $NOTIFY_SOCKET:
//
//   - STATUS= while it waits ("waiting for a leader") and once it serves;
//   - READY=1 once its Ready holds, as /readyz says: for a server, its
//     ports serve, a leader is known and it has caught up applying
//     what is committed; for a gateway, it has a routing table;
//   - RELOADING=1, then READY=1, around a reload (SIGHUP) once ready;
//   - STOPPING=1 when shutdown begins;
//   - WATCHDOG=1 every half $WATCHDOG_USEC while Healthy holds (a
//     server's Raft loop runs), when the unit sets WatchdogSec=.
//
// Without $NOTIFY_SOCKET it sends nothing and starts nothing.
type sdNotifier struct {
	srv    readiness
	logger *slog.Logger
	on     bool

	mu      sync.Mutex
	ready   bool   // READY=1 was sent
	stopped bool   // STOPPING=1 was sent: nothing more goes out
	status  string // the last STATUS= sent

	cancel context.CancelFunc
	done   chan struct{}
}

// readiness is what a notifier watches: *server.Server, or a gateway
// through gatewayReadiness.
type readiness interface {
	Ready() error   // nil: take traffic (/readyz's rule)
	Healthy() error // nil: alive (/healthz's rule)
}

// sdPoll is how often the notifier looks at readiness: READY=1 follows
// the first leader within this much.
const sdPoll = 100 * time.Millisecond

func newSDNotifier(srv readiness, logger *slog.Logger) *sdNotifier {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &sdNotifier{srv: srv, logger: logger, on: os.Getenv("NOTIFY_SOCKET") != ""}
}

// start watches readiness until ctx ends or stopping. Call it once the
// server serves and handles SIGHUP: the manager may ask for a reload as
// soon as READY=1 arrives.
func (n *sdNotifier) start(ctx context.Context) {
	if !n.on {
		return
	}
	watchdog, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		n.logger.Warn("watchdog settings ignored", "err", err)
	}
	n.logger.Info("notifying the service manager", "socket", os.Getenv("NOTIFY_SOCKET"), "watchdog", watchdog)
	ctx, n.cancel = context.WithCancel(ctx)
	n.done = make(chan struct{})
	go n.watch(ctx, watchdog)
}

func (n *sdNotifier) watch(ctx context.Context, watchdog time.Duration) {
	defer close(n.done)
	every := sdPoll
	if watchdog > 0 {
		every = min(every, watchdog/2)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var pinged time.Time
	for {
		n.update()
		if watchdog > 0 && time.Since(pinged) >= watchdog/2 && n.srv.Healthy() == nil {
			n.send(daemon.SdNotifyWatchdog)
			pinged = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// update sends STATUS= when it changed, and READY=1 the first time the
// server is ready.
func (n *sdNotifier) update() {
	n.mu.Lock()
	defer n.mu.Unlock()
	err := n.srv.Ready()
	var lines []string
	if err == nil && !n.ready {
		n.ready = true
		lines = append(lines, daemon.SdNotifyReady)
	}
	if s := sdStatus(err); s != n.status {
		n.status = s
		lines = append(lines, "STATUS="+s)
	}
	n.sendLocked(lines...)
}

// reloading wraps reload in RELOADING=1 and READY=1. Before the server
// was first ready it only reloads: the READY=1 still to come ends the
// start, and a reload inside it would end it early.
func (n *sdNotifier) reloading(reload func() error) func() error {
	if !n.on {
		return reload
	}
	return func() error {
		n.mu.Lock()
		announce := n.ready && !n.stopped
		if announce {
			n.status = "reloading"
			n.sendLocked(daemon.SdNotifyReloading, strings.TrimSuffix(daemon.SdNotifyMonotonicUsec(), "\n"), "STATUS=reloading")
		}
		n.mu.Unlock()
		err := reload()
		if announce {
			n.mu.Lock()
			if !n.stopped {
				n.status = sdStatus(n.srv.Ready())
				n.sendLocked(daemon.SdNotifyReady, "STATUS="+n.status)
			}
			n.mu.Unlock()
		}
		return err
	}
}

// stopping ends the watch and sends STOPPING=1, the last notice.
func (n *sdNotifier) stopping() {
	if !n.on {
		return
	}
	if n.cancel != nil {
		n.cancel()
		<-n.done
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sendLocked(daemon.SdNotifyStopping, "STATUS=stopping")
	n.stopped = true
}

func (n *sdNotifier) send(lines ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sendLocked(lines...)
}

// sendLocked sends lines as one datagram; n.mu is held.
func (n *sdNotifier) sendLocked(lines ...string) {
	if len(lines) == 0 || n.stopped {
		return
	}
	if _, err := daemon.SdNotify(false, strings.Join(lines, "\n")); err != nil {
		n.logger.Warn("notify the service manager", "state", lines, "err", err)
	}
}

// sdStatus is the STATUS= text for a readiness answer.
func sdStatus(err error) string {
	switch {
	case err == nil:
		return "serving"
	case errors.Is(err, server.ErrNoLeader):
		return "waiting for a leader"
	case errors.Is(err, errNoRoutingTable):
		return "waiting for a routing table"
	}
	return err.Error()
}
