package netns

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A crashed run leaves namespaces, links and processes; the next run's
// Cleanup removes every one of them (the issue: "also at start-up from a
// previous crashed run").
func TestCleanupRemovesALeftoverRun(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 16*time.Minute)
	defer cancel()
	unlock, err := Lock(ctx, 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	logger := slog.New(slog.DiscardHandler)
	if err := Cleanup(ctx, logger); err != nil {
		t.Fatal(err)
	}
	n, err := Setup(ctx, logger)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.AddNode(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// A process left running inside the namespace, as a crashed harness
	// would leave a node.
	cmd := n.Command(0, "sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	if err := Cleanup(ctx, logger); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("the process in the namespace survived Cleanup")
	}
	spaces, err := run(ctx, "ip", "netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	links, err := run(ctx, "ip", "-o", "link", "show")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(spaces, Prefix) || strings.Contains(links, Prefix) {
		t.Fatalf("leftovers after Cleanup:\n%s\n%s", spaces, links)
	}
}
