//go:build linux && (amd64 || arm64)

package raftlog

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

func openTestJournal(t *testing.T) *osRandomFile {
	t.Helper()
	f, err := OSFS{}.OpenFile(filepath.Join(t.TempDir(), "raft.wal"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	return f.(*osRandomFile)
}

func TestDatasyncGoesThroughAIO(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f := openTestJournal(t)
	want := []byte("record")
	if _, err := f.WriteAt(want, 4096); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := f.Datasync(); err != nil {
			t.Fatalf("Datasync %d: %v", i, err)
		}
	}
	if !f.wait.usesAIO() {
		t.Fatal("Datasync was a plain fdatasync, want an AIO request on this kernel")
	}
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, 4096); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back %q, %v; want %q", got, err, want)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestDatasyncParksItsGoroutine runs with one P: while the disk takes its
// time, the goroutine waiting for it is parked in the poller ("IO wait"),
// and other goroutines run. A plain fdatasync holds the only P ("syscall").
func TestDatasyncParksItsGoroutine(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f := openTestJournal(t)
	defer f.Close()
	if states := watchLongDatasync(t, f); states["IO wait"] == 0 {
		t.Fatalf("the syncing goroutine was never seen parked in the poller; states seen: %v", states)
	}
}

// TestDatasyncBlocksWithSeveralPs: with two Ps the fdatasync is a plain
// system call ("syscall"), never parked, and no AIO context is opened.
func TestDatasyncBlocksWithSeveralPs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	f := openTestJournal(t)
	defer f.Close()
	states := watchLongDatasync(t, f)
	if states["IO wait"] > 0 || states["syscall"] == 0 {
		t.Fatalf("states of the syncing goroutine: %v, want it seen in a system call and never parked", states)
	}
	if f.wait.usesAIO() {
		t.Fatal("Datasync with two Ps opened an AIO context")
	}
}

// watchLongDatasync dirties enough pages that writing them back takes
// milliseconds on any disk, runs f.Datasync in a goroutine, and returns how
// often that goroutine was seen in each state until it returned.
func watchLongDatasync(t *testing.T, f *osRandomFile) map[string]int {
	t.Helper()
	chunk := bytes.Repeat([]byte{0xa5}, 1<<20)
	for off := int64(0); off < 32<<20; off += int64(len(chunk)) {
		if _, err := f.WriteAt(chunk, off); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- f.Datasync() }()
	states := map[string]int{}
	buf := make([]byte, 1<<20)
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Datasync: %v", err)
			}
			return states
		default:
		}
		if s, ok := syncingState(buf[:runtime.Stack(buf, true)]); ok {
			states[s]++
		}
		runtime.Gosched()
	}
}

// syncingState finds the goroutine inside diskWait.datasync in a stack
// dump of all goroutines and returns its state ("IO wait", "syscall",
// "running", ...).
func syncingState(dump []byte) (string, bool) {
	for _, g := range strings.Split(string(dump), "\n\n") {
		if !strings.Contains(g, "(*diskWait).datasync") {
			continue
		}
		head, _, _ := strings.Cut(g, "\n")
		_, state, ok := strings.Cut(head, "[")
		if !ok {
			return "", false
		}
		state, _, _ = strings.Cut(state, "]")
		state, _, _ = strings.Cut(state, ",")
		return state, true
	}
	return "", false
}

func TestDatasyncFallsBackWhereAIORefuses(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	var d diskWait
	for i := range 2 {
		// NB: a pipe has no fsync: io_submit refuses it, and so does the
		// plain fdatasync that follows.
		if err := d.park(int(w.Fd())); !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("park %d of a pipe: %v, want EINVAL", i, err)
		}
		if d.usesAIO() || !d.plain {
			t.Fatalf("park %d: still on AIO after the kernel refused it", i)
		}
	}
}

func TestDatasyncParksProbesTheNearestDirectory(t *testing.T) {
	if !DatasyncParks(filepath.Join(t.TempDir(), "not", "made", "yet")) {
		t.Fatal("DatasyncParks = false for a directory to be made under one that exists, want true on this kernel")
	}
}
