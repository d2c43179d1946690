package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/raftlog"
)

const (
	fileBloated = "bloated"
	fileFresh   = "fresh"
)

// bloatShape is the history of a bloated file: trunc entries written and
// truncated away, then live entries that stay.
type bloatShape struct {
	live, trunc uint64
}

type buildResult struct {
	dir       string
	entries   uint64 // entries written
	live      uint64 // entries left
	written   int64  // data bytes written
	fileBytes int64  // bytes on disk after truncation
	freePages int
	freeOK    bool
}

// buildBloated writes shape.trunc+shape.live entries into a new store in
// dir, in batches, then truncates all but the last shape.live, as a Raft
// library does after a snapshot. Progress goes to stderr.
func buildBloated(ctx context.Context, k storeKind, dir string, shape bloatShape, data []byte) (buildResult, error) {
	b := buildResult{dir: dir, entries: shape.trunc + shape.live, live: shape.live}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return b, err
	}
	s, err := k.open(dir)
	if err != nil {
		return b, err
	}
	start, lastReport := time.Now(), time.Now()
	total := int64(b.entries) * int64(len(data))
	for next := uint64(1); next <= b.entries; {
		if err := ctx.Err(); err != nil {
			_ = s.close()
			return b, err
		}
		n := min(uint64(*flagBatch), b.entries-next+1)
		if err := s.append(next, int(n), data); err != nil {
			_ = s.close()
			return b, fmt.Errorf("append %d entries at %d: %w", n, next, err)
		}
		next += n
		b.written += int64(n) * int64(len(data))
		if time.Since(lastReport) > 2*time.Second || next > b.entries {
			lastReport = time.Now()
			logf("build %s: %s / %s written (%.0f MiB/s)", k.name, mib(b.written), mib(total),
				float64(b.written)/(1<<20)/time.Since(start).Seconds())
		}
	}
	logf("build %s: truncating entries [1, %d], keeping %d", k.name, shape.trunc, shape.live)
	if err := s.truncateHead(shape.trunc); err != nil {
		_ = s.close()
		return b, fmt.Errorf("truncate: %w", err)
	}
	if err := s.close(); err != nil {
		return b, err
	}
	b.fileBytes = dirBytes(dir)
	if b.freePages, b.freeOK, err = k.freePages(dir); err != nil {
		return b, fmt.Errorf("count free pages: %w", err)
	}
	if b.freeOK && b.freePages < *flagFreePages {
		logf("WARNING: %s has only %d free pages after truncation (want >= %d): raise -free-pages", k.name, b.freePages, *flagFreePages)
	}
	logf("build %s: done in %s: %s on disk, free pages %d", k.name, time.Since(start).Round(time.Second), mib(b.fileBytes), b.freePages)
	return b, nil
}

// latencies are one measurement's append latencies.
type latencies struct {
	sorted []time.Duration
}

// p is the p-th percentile in milliseconds (nearest rank).
func (l latencies) p(p float64) float64 { return harness.Millis(harness.Percentile(l.sorted, p)) }

// target is one (store, file) pair being measured: an open store and the
// next index to append.
type target struct {
	kind storeKind
	file string
	s    store
	next uint64
}

func openTarget(k storeKind, file, dir string) (*target, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s, err := k.open(dir)
	if err != nil {
		return nil, err
	}
	next, err := nextIndex(k, s)
	if err != nil {
		_ = s.close()
		return nil, err
	}
	return &target{kind: k, file: file, s: s, next: next}, nil
}

// measureRounds appends one entry to every target per round, in an order
// shuffled afresh each round, so every store sees the same machine noise:
// -warmup rounds untimed, then -appends timed rounds (at least -min-appends,
// at most -max-time). After each append it waits, untimed, for the store's
// background work. It returns each target's latencies.
//
// NB: shuffled, not rotated. With a rotating start each target always ran
// right after the same neighbour, and an fdatasync issued just after a
// BoltDB store's multi-megabyte commit on the bloated file is slower (the
// device is still settling it): the two targets after it were slow in every
// sitting, whichever store they were.
//
// NB: a garbage collection runs between rounds, untimed. The stores share
// this process, and the BoltDB stores allocate a freelist copy per commit
// (megabytes on a bloated file) whose collection would otherwise land, as
// mark assists and background marking, inside whichever store's append
// happens to run next.
func measureRounds(ctx context.Context, targets []*target, data []byte) ([]latencies, error) {
	lat := make([][]time.Duration, len(targets))
	rng := rand.New(rand.NewPCG(1, 2)) // the same orders in every sitting
	var deadline time.Time
	for round := 0; ; round++ {
		runtime.GC()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		measured := round - *flagWarmup
		if measured == 0 {
			deadline = time.Now().Add(*flagMaxTime)
		}
		if measured >= *flagAppends || (measured >= *flagMinAppends && time.Now().After(deadline)) {
			break
		}
		for _, i := range rng.Perm(len(targets)) {
			t := targets[i]
			t0 := time.Now()
			if err := t.s.append(t.next, 1, data); err != nil {
				return nil, fmt.Errorf("%s on the %s file: append %d: %w", t.kind.name, t.file, t.next, err)
			}
			d := time.Since(t0)
			t.next++
			if measured >= 0 {
				lat[i] = append(lat[i], d)
			}
			// NB: untimed. A store's background work (Lodestone folds its
			// journal into raft.db after the append that hands it over)
			// would otherwise run during the next store's append, on the
			// same CPUs and disk, and be charged to it.
			if err := t.s.settle(); err != nil {
				return nil, fmt.Errorf("%s on the %s file: settle after append %d: %w", t.kind.name, t.file, t.next-1, err)
			}
		}
	}
	out := make([]latencies, len(targets))
	for i := range lat {
		slices.Sort(lat[i])
		out[i] = latencies{sorted: lat[i]}
	}
	return out, nil
}

// nextIndex is the index after the store's last entry.
func nextIndex(k storeKind, s store) (uint64, error) {
	switch s := s.(type) {
	case *lodestoneStore:
		last, err := s.l.LastIndex()
		return last + 1, err
	case *hashicorpStore:
		ls, ok := s.s.(interface{ LastIndex() (uint64, error) })
		if !ok {
			return 0, fmt.Errorf("%s has no LastIndex", k.name)
		}
		last, err := ls.LastIndex()
		return last + 1, err
	}
	return 0, fmt.Errorf("unknown store type %T", s)
}

// rotationRun is one online rotation of a copy of the bloated file.
type rotationRun struct {
	lat                   latencies // appends that completed while the rotation ran
	pause, took           time.Duration
	beforeBytes           int64
	afterBytes, liveBytes int64 // after the rotation: file size and live data
}

// measureRotation opens the bloated Lodestone log in dir as the server does
// (default Options: automatic rotation on), so the Log's own goroutine
// starts rotating at Open; it appends back to back until Stats reports the
// rotation done. It removes dir afterwards unless -keep.
func measureRotation(ctx context.Context, dir string, data []byte) (rotationRun, error) {
	var r rotationRun
	defer func() {
		if !*flagKeep {
			_ = os.RemoveAll(dir)
		}
	}()
	if fi, err := os.Stat(filepath.Join(dir, "raft.db")); err == nil {
		r.beforeBytes = fi.Size()
	}
	logf("rotation: opening %s with default options (rotates above 50%% free, 64 MiB) and appending", dir)
	l, err := raftlog.Open(dir, raftlog.Options{})
	if err != nil {
		return r, err
	}
	s := &lodestoneStore{l: l}
	next, err := l.LastIndex()
	if err != nil {
		_ = l.Close()
		return r, err
	}
	next++
	var lat []time.Duration
	deadline := time.Now().Add(5 * time.Minute)
	for {
		st := l.Stats()
		if st.Rotations > 0 {
			break
		}
		switch {
		case st.RotationFailures > 0:
			_ = l.Close()
			return r, errors.New("the Log's rotation failed (see its log)")
		case time.Now().After(deadline):
			_ = l.Close()
			return r, errors.New("the Log did not rotate within 5 minutes")
		case ctx.Err() != nil:
			_ = l.Close()
			return r, ctx.Err()
		}
		t0 := time.Now()
		if err := s.append(next, 1, data); err != nil {
			_ = l.Close()
			return r, fmt.Errorf("append %d during rotation: %w", next, err)
		}
		lat = append(lat, time.Since(t0))
		next++
	}
	after := l.Stats()
	slices.Sort(lat)
	r.lat, r.pause, r.took = latencies{sorted: lat}, after.LastRotationPause, after.LastRotationDuration
	r.afterBytes, r.liveBytes = after.FileBytes, after.LiveBytes
	return r, l.Close()
}

// copyDir copies the regular files of src (and its subdirectories) to dst,
// each fsynced.
func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o700)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			_ = out.Close()
			return err
		}
		// NB: without this the copy's gigabytes stay dirty in the page cache
		// and the kernel writes them back while the rotation is measured,
		// stalling every fsync behind them.
		if err := out.Sync(); err != nil {
			_ = out.Close()
			return err
		}
		return out.Close()
	})
}

// pinSelf sets the affinity of every thread of this process to the
// taskset-style CPU list s ("1", "0,1", "0-3"). Threads started later
// inherit it.
func pinSelf(s string) error {
	var set unix.CPUSet
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return fmt.Errorf("bad CPU list %q", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return fmt.Errorf("bad CPU list %q", s)
			}
		}
		for cpu := a; cpu <= b; cpu++ {
			set.Set(cpu)
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return fmt.Errorf("thread %d: %w", tid, err)
		}
	}
	runtime.GOMAXPROCS(set.Count())
	return nil
}

// measureBackToBack appends -appends entries back to back to one fresh
// store, after -warmup untimed ones, and waits for its background work
// before returning, so nothing of it reaches the next store's turn. Unlike
// measureRounds, a store's background work overlaps its own next appends,
// as in a server writing steadily. No GC between appends: each store pays
// for its own garbage.
func measureBackToBack(ctx context.Context, k storeKind, dir string, data []byte) (latencies, error) {
	t, err := openTarget(k, fileFresh, dir)
	if err != nil {
		return latencies{}, err
	}
	runtime.GC()
	lat := make([]time.Duration, 0, *flagAppends)
	for n := -*flagWarmup; n < *flagAppends; n++ {
		if err := ctx.Err(); err != nil {
			_ = t.s.close()
			return latencies{}, err
		}
		t0 := time.Now()
		if err := t.s.append(t.next, 1, data); err != nil {
			_ = t.s.close()
			return latencies{}, fmt.Errorf("%s back to back: append %d: %w", k.name, t.next, err)
		}
		if n >= 0 {
			lat = append(lat, time.Since(t0))
		}
		t.next++
	}
	err = t.s.settle()
	if cerr := t.s.close(); err == nil {
		err = cerr
	}
	slices.Sort(lat)
	return latencies{sorted: lat}, err
}
