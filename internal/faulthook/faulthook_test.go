package faulthook_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/internal/faulthook"
	"github.com/lodestone-kv/lodestone/raftnode"
	"github.com/lodestone-kv/lodestone/server"
	"github.com/lodestone-kv/lodestone/server/servertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startServer runs a one-member server, with fault hooks when f is set.
func startServer(t *testing.T, f *raftnode.Faults) *server.Server {
	return servertest.Start(t, func(cfg *server.Config) {
		cfg.Faults = f
		cfg.Logger = slog.New(slog.DiscardHandler)
	})
}

func TestSetDiskDelay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := &raftnode.Faults{}
	srv := startServer(t, f)
	if err := faulthook.SetDiskDelay(ctx, srv.HTTPAddr(), 250*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := f.DiskDelay(); got != 250*time.Millisecond {
		t.Fatalf("disk delay %v after setting 250ms", got)
	}
	if err := faulthook.SetDiskDelay(ctx, srv.HTTPAddr(), 0); err != nil {
		t.Fatal(err)
	}
	if got := f.DiskDelay(); got != 0 {
		t.Fatalf("disk delay %v after removing it", got)
	}
}

// A server without --fault-hooks has no such endpoint: the error says so.
func TestSetDiskDelayWithoutHooks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv := startServer(t, nil)
	err := faulthook.SetDiskDelay(ctx, srv.HTTPAddr(), time.Second)
	if err == nil || !strings.Contains(err.Error(), "--fault-hooks") {
		t.Fatalf("SetDiskDelay on a server without hooks: %v, want an error naming --fault-hooks", err)
	}
}
