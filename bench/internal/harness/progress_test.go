package harness

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestLogfStampsAndNames(t *testing.T) {
	var b bytes.Buffer
	logf := newLogf(&b, "somebench", time.Now().Add(-1500*time.Millisecond))
	logf("phase %d: %s", 2, "writes")
	logf("done")
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2: %q", len(lines), b.String())
	}
	re := regexp.MustCompile(`^somebench: +(\d+\.\d)s phase 2: writes$`)
	m := re.FindStringSubmatch(lines[0])
	if m == nil {
		t.Fatalf("line %q does not match %s", lines[0], re)
	}
	if stamp, err := strconv.ParseFloat(m[1], 64); err != nil || stamp < 1.5 {
		t.Errorf("stamp %ss, want at least 1.5s since start", m[1])
	}
	if !strings.HasSuffix(lines[1], "s done") {
		t.Errorf("second line %q", lines[1])
	}
	// A format without arguments is still a format: "%%" prints "%".
	b.Reset()
	logf("100%%")
	if !strings.HasSuffix(b.String(), "s 100%\n") {
		t.Errorf("%q", b.String())
	}
}

func TestLoadAvg(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "loadavg")
	if err := os.WriteFile(path, []byte("0.52 0.61 0.70 2/345 6789\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := loadAvgFrom(path); got != "0.52 0.61 0.70" {
		t.Errorf("loadAvgFrom = %q", got)
	}
	if err := os.WriteFile(path, []byte("0.52\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := loadAvgFrom(path); got != "unknown" {
		t.Errorf("short file: %q, want unknown", got)
	}
	if got := loadAvgFrom(filepath.Join(dir, "missing")); got != "unknown" {
		t.Errorf("missing file: %q, want unknown", got)
	}
	if got := LoadAvg(); got == "" {
		t.Error("LoadAvg is empty")
	}
}

func TestPollSucceedsAfterFailures(t *testing.T) {
	tries := 0
	err := Poll(context.Background(), 10*time.Second, "the third try", nil, func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("try has no deadline")
		}
		if tries++; tries < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || tries != 3 {
		t.Errorf("Poll = %v after %d tries, want nil after 3", err, tries)
	}
}

func TestPollTimesOutWithLastError(t *testing.T) {
	last := errors.New("still refused")
	err := Poll(context.Background(), 0, "a leader", nil, func(context.Context) error { return last })
	if !errors.Is(err, last) || !strings.Contains(err.Error(), "a leader: not within") {
		t.Errorf("Poll = %v, want the timeout naming what and wrapping the last error", err)
	}
}

func TestPollStopsWhenNotAlive(t *testing.T) {
	gone := errors.New("member exited")
	tries := 0
	err := Poll(context.Background(), time.Minute, "x", func() error { return gone }, func(context.Context) error {
		tries++
		return errors.New("refused")
	})
	if !errors.Is(err, gone) || tries != 1 {
		t.Errorf("Poll = %v after %d tries, want the alive error after 1", err, tries)
	}
}

func TestPollEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	tries := 0
	err := Poll(ctx, time.Minute, "x", nil, func(context.Context) error {
		tries++
		cancel()
		return errors.New("refused")
	})
	if !errors.Is(err, context.Canceled) || tries != 1 {
		t.Errorf("Poll = %v after %d tries, want context.Canceled after 1", err, tries)
	}
}
