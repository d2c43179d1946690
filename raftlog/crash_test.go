package raftlog_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
)

// The crash harness is a workload (TestCrashChild, run in a child process)
// plus an independent checker (TestCrashRecovery, the parent).
//
// The child opens the log and performs random operations forever: appends
// with a hard state, overwrites of an uncommitted suffix with a higher term,
// snapshots, compactions and snapshots "from a leader". Before each operation
// it prints "B <op>", after the operation returned it prints "S" ("reported
// durable"). The parent kills it with SIGKILL at a random moment, reopens the
// log, and checks that the log is exactly the state after every reported
// operation, or that state plus the one operation in flight — all of it or
// none of it (a Save is one transaction). Checked: every reported index
// present with its term and data, checksums valid (Open verifies them all and
// the parent re-reads every entry from bbolt), indexes contiguous, hard state
// and snapshot equal to the model's.

const (
	crashDirEnv  = "RAFTLOG_CRASH_CHILD_DIR"
	crashSeedEnv = "RAFTLOG_CRASH_CHILD_SEED"
	// crashKillAtEnv names a rotation step (raftlog.RotateSteps): the child
	// rotates raft.db over and over while the workload runs, and SIGKILLs
	// itself when a rotation reaches that step. Or it names a checkpoint
	// step (raftlog.FoldSteps), where the child SIGKILLs itself the n-th
	// time a fold reaches it.
	crashKillAtEnv = "RAFTLOG_CRASH_CHILD_KILL_AT"
)

var crashConfState = raftpb.ConfState{Voters: []uint64{1, 2, 3}}

// crashOp is one operation of the workload, as printed on a "B" line.
type crashOp struct {
	kind  string // "save", "snap", "compact", "apply"
	first uint64 // save: first index; snap/compact/apply: the index
	term  uint64 // save: entry term; apply: snapshot term
	n     uint64 // save: number of entries
	hs    raftpb.HardState
}

func (o crashOp) String() string {
	return fmt.Sprintf("%s %d %d %d %d %d %d", o.kind, o.first, o.term, o.n, o.hs.Term, o.hs.Vote, o.hs.Commit)
}

func parseCrashOp(s string) (crashOp, error) {
	f := strings.Fields(s)
	if len(f) != 7 {
		return crashOp{}, fmt.Errorf("bad op %q", s)
	}
	var v [6]uint64
	for k := range v {
		x, err := strconv.ParseUint(f[k+1], 10, 64)
		if err != nil {
			return crashOp{}, fmt.Errorf("bad op %q: %w", s, err)
		}
		v[k] = x
	}
	return crashOp{kind: f[0], first: v[0], term: v[1], n: v[2],
		hs: raftpb.HardState{Term: v[3], Vote: v[4], Commit: v[5]}}, nil
}

func snapPayload(i, t uint64) []byte { return fmt.Appendf(nil, "snapshot %d/%d", i, t) }

// crashModel is the state the checker expects on disk.
type crashModel struct {
	prevIndex, prevTerm uint64
	terms               []uint64 // terms[k] is the term of entry prevIndex+1+k
	hs                  raftpb.HardState
	snapIndex, snapTerm uint64
}

func (m crashModel) last() uint64 { return m.prevIndex + uint64(len(m.terms)) }

func (m crashModel) term(i uint64) uint64 {
	if i == m.prevIndex {
		return m.prevTerm
	}
	return m.terms[i-m.prevIndex-1]
}

// apply returns the model after op.
func (m crashModel) apply(op crashOp) crashModel {
	m.terms = append([]uint64(nil), m.terms...)
	switch op.kind {
	case "save":
		if op.n > 0 {
			m.terms = m.terms[:op.first-m.prevIndex-1]
			for range op.n {
				m.terms = append(m.terms, op.term)
			}
		}
		m.hs = op.hs
	case "snap":
		m.snapIndex, m.snapTerm = op.first, m.term(op.first)
	case "compact":
		t := m.term(op.first)
		m.terms = m.terms[op.first-m.prevIndex:]
		m.prevIndex, m.prevTerm = op.first, t
	case "apply":
		m.snapIndex, m.snapTerm = op.first, op.term
		m.prevIndex, m.prevTerm = op.first, op.term
		m.terms = nil
		m.hs.Commit = max(m.hs.Commit, op.first)
	}
	return m
}

// diff compares the model with the log and describes the first difference.
func (m crashModel) diff(l *raftlog.Log) string {
	first, _ := l.FirstIndex()
	last, _ := l.LastIndex()
	if first != m.prevIndex+1 || last != m.last() {
		return fmt.Sprintf("log is [%d, %d], want [%d, %d]", first, last, m.prevIndex+1, m.last())
	}
	if t, err := l.Term(m.prevIndex); err != nil || t != m.prevTerm {
		return fmt.Sprintf("Term(%d) = %d, %v; want %d", m.prevIndex, t, err, m.prevTerm)
	}
	if first <= last {
		ents, err := l.Entries(first, last+1, ^uint64(0))
		if err != nil {
			return fmt.Sprintf("Entries(%d, %d): %v", first, last+1, err)
		}
		if uint64(len(ents)) != last+1-first {
			return fmt.Sprintf("Entries returned %d entries, want %d", len(ents), last+1-first)
		}
		for k, e := range ents {
			i := first + uint64(k)
			if e.Index != i || e.Term != m.term(i) {
				return fmt.Sprintf("entry %d is %d/%d, want %d/%d", i, e.Index, e.Term, i, m.term(i))
			}
			if !bytes.Equal(e.Data, payload(e.Index, e.Term)) {
				return fmt.Sprintf("entry %d has wrong data", i)
			}
		}
	}
	hs, cs, _ := l.InitialState()
	if hs != m.hs {
		return fmt.Sprintf("hard state %+v, want %+v", hs, m.hs)
	}
	snap, err := l.ReadSnapshotData()
	if err != nil {
		return fmt.Sprintf("Snapshot: %v", err)
	}
	if snap.Metadata.Index != m.snapIndex || snap.Metadata.Term != m.snapTerm {
		return fmt.Sprintf("snapshot %d/%d, want %d/%d", snap.Metadata.Index, snap.Metadata.Term, m.snapIndex, m.snapTerm)
	}
	if m.snapIndex != 0 {
		if !bytes.Equal(snap.Data, snapPayload(m.snapIndex, m.snapTerm)) {
			return fmt.Sprintf("snapshot %d has wrong data", m.snapIndex)
		}
		if cs.Equivalent(crashConfState) != nil {
			return fmt.Sprintf("conf state %+v, want %+v", cs, crashConfState)
		}
	}
	return ""
}

// TestCrashChild is the workload; it does nothing unless started by
// TestCrashRecovery.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("run by TestCrashRecovery in a child process")
	}
	seed, _ := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	if err := crashWorkload(dir, seed, os.Getenv(crashKillAtEnv)); err != nil {
		fmt.Printf("E %v\n", err)
		os.Exit(3)
	}
}

func crashWorkload(dir string, seed uint64, killAt string) error {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	opts := raftlog.Options{CacheEntries: 64, RotateFreeRatio: -1}
	foldStep := slices.Contains(raftlog.FoldSteps, killAt)
	if foldStep {
		// Die at the n-th time a fold or a switch reaches the step, so
		// the kill lands after a varying amount of work.
		n := 1 + int(seed%6)
		opts = raftlog.WithFoldHook(opts, func(step string) {
			if step == killAt {
				if n--; n == 0 {
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {} // the signal is on its way
				}
			}
		})
	} else if killAt != "" {
		opts = raftlog.WithRotateHook(opts, 8, func(step string) {
			if step == killAt {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		})
	}
	l, err := raftlog.Open(dir, opts)
	if err != nil {
		return err
	}
	defer l.Close()
	startRotating := make(chan struct{})
	rotateAfter := 10 + rng.IntN(150) // operations before the first rotation
	if killAt != "" && !foldStep {
		// Rotate over and over, concurrently with the workload, until a
		// rotation reaches killAt. One may find an empty log and skip the
		// "copy" step; later ones copy what the workload wrote.
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		defer func() { cancel(); <-done }()
		go func() {
			defer close(done)
			select {
			case <-startRotating:
			case <-ctx.Done():
				return
			}
			for ctx.Err() == nil {
				if _, err := l.Rotate(ctx, raftlog.RotateOptions{}); err != nil && ctx.Err() == nil {
					fmt.Printf("E rotate: %v\n", err)
					os.Exit(3)
				}
			}
		}()
	}
	hs, _, _ := l.InitialState()
	first, _ := l.FirstIndex()
	last, _ := l.LastIndex()
	lastTerm, _ := l.Term(last)
	term := max(hs.Term, lastTerm, 1)
	snap, err := l.Snapshot()
	if err != nil {
		return err
	}
	snapIndex := snap.Metadata.Index
	// NB: one unbuffered write per line, so a line is either wholly in the
	// pipe before the kill or not at all (a torn last line is ignored).
	say := func(format string, args ...any) { _, _ = fmt.Fprintf(os.Stdout, format+"\n", args...) }
	deadline := time.Now().Add(20 * time.Second) // in case the parent is gone
	for ops := 0; time.Now().Before(deadline); ops++ {
		if ops == rotateAfter {
			close(startRotating)
		}
		var op crashOp
		switch r := rng.IntN(100); {
		case r < 4 && last > hs.Commit: // new leader overwrites an uncommitted suffix
			term++
			start := hs.Commit + 1 + rng.Uint64N(last-hs.Commit)
			op = crashOp{kind: "save", first: start, term: term, n: 1 + rng.Uint64N(4)}
			op.hs = raftpb.HardState{Term: term, Vote: 1 + rng.Uint64N(3), Commit: hs.Commit}
		case r < 8: // hard state only: a vote in a new term
			term++
			op = crashOp{kind: "save", hs: raftpb.HardState{Term: term, Vote: 1 + rng.Uint64N(3), Commit: hs.Commit}}
		case r < 12 && hs.Commit > snapIndex:
			op = crashOp{kind: "snap", first: snapIndex + 1 + rng.Uint64N(hs.Commit-snapIndex)}
		case r < 16 && snapIndex > first-1:
			op = crashOp{kind: "compact", first: first + rng.Uint64N(snapIndex-first+1)}
		case r < 18: // far behind: the leader sends a snapshot
			op = crashOp{kind: "apply", first: last + 1 + rng.Uint64N(20), term: term}
		default: // append with a hard state that commits part of the log
			n := 1 + rng.Uint64N(8)
			op = crashOp{kind: "save", first: last + 1, term: term, n: n}
			op.hs = raftpb.HardState{Term: term, Vote: hs.Vote, Commit: hs.Commit + rng.Uint64N(last+n-hs.Commit+1)}
		}
		say("B %s", op)
		switch op.kind {
		case "save":
			var ents []raftpb.Entry
			if op.n > 0 {
				ents = mkEnts(op.first, slicesRepeat(op.term, op.n)...)
			}
			err = l.Save(op.hs, ents)
			if err == nil {
				hs = op.hs
				if op.n > 0 {
					last = op.first + op.n - 1
				}
			}
		case "snap":
			_, err = l.CreateSnapshot(op.first, &crashConfState, snapPayload(op.first, mustTerm(l, op.first)))
			snapIndex = op.first
		case "compact":
			err = l.Compact(op.first)
			first = op.first + 1
		case "apply":
			err = l.ApplySnapshot(raftpb.Snapshot{
				Data:     snapPayload(op.first, op.term),
				Metadata: raftpb.SnapshotMetadata{Index: op.first, Term: op.term, ConfState: crashConfState},
			})
			snapIndex, first, last = op.first, op.first+1, op.first
			hs.Commit = max(hs.Commit, op.first)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		say("S")
	}
	return nil
}

func mustTerm(l *raftlog.Log, i uint64) uint64 {
	t, err := l.Term(i)
	if err != nil {
		panic(err)
	}
	return t
}

func slicesRepeat(t, n uint64) []uint64 {
	s := make([]uint64, n)
	for k := range s {
		s[k] = t
	}
	return s
}

// TestCrashRecovery kills the workload with SIGKILL at random moments and
// checks after each kill that every operation reported durable survived and
// the one in flight is all there or not at all: a Save's entries and hard
// state are one journal record (or one bbolt transaction), durable before
// Save returns and so before the messages that depend on them are sent
// (docs/architecture.md, "Nothing acknowledged is ever lost"; FORMAT.md
// "Journal", "Replay").
func TestCrashRecovery(t *testing.T) {
	if os.Getenv(crashDirEnv) != "" {
		t.Skip("in the child")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	rng := crashRNG(t)
	dir := t.TempDir()
	var c crashChecker
	const iterations, budget = 30, 15 * time.Second
	start := time.Now()
	for iter := 0; iter < iterations && time.Since(start) < budget; iter++ {
		// Let the child report a random number of operations, then kill it
		// after a random extra delay, so the kill lands anywhere: inside a
		// commit, between the fsyncs, in a snapshot file write.
		want := 1 + rng.IntN(120)
		// NB: the sleep chooses the kill moment; it waits for no state.
		delay := time.Duration(rng.IntN(3000)) * time.Microsecond
		lines := runCrashChild(t, dir, rng.Uint64(), "", want, delay)
		c.check(t, iter, dir, lines)
	}
	t.Logf("%s, %s", c, time.Since(start).Round(time.Millisecond))
	if c.kills < 5 {
		t.Errorf("only %d kills within %s", c.kills, budget)
	}
}

// TestCrashRotation kills the workload at each step of a rotation of
// raft.db — before the copy, during it, after its fsync, before the rename
// (catch-up committed), after the rename and after the swap — while the
// workload keeps writing, and checks that the log reopens with every
// operation reported durable, the in-flight one all or nothing, and no
// rotation file left behind (FORMAT.md "Rotation").
func TestCrashRotation(t *testing.T) {
	if os.Getenv(crashDirEnv) != "" {
		t.Skip("in the child")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	rng := crashRNG(t)
	const perStep = 3
	start := time.Now()
	for _, step := range raftlog.RotateSteps {
		t.Run(step, func(t *testing.T) {
			dir := t.TempDir()
			var c crashChecker
			for iter := range perStep {
				lines := runCrashChild(t, dir, rng.Uint64(), step, 0, 0)
				c.check(t, iter, dir, lines)
				if _, err := os.Stat(filepath.Join(dir, "raft.db.rotating")); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("iteration %d: raft.db.rotating survived a reopen: %v", iter, err)
				}
			}
			t.Logf("%s", c)
		})
	}
	t.Logf("%d steps x %d kills in %s", len(raftlog.RotateSteps), perStep, time.Since(start).Round(time.Millisecond))
}

// TestCrashFold kills the workload with SIGKILL at each step of a
// background checkpoint — the slot switch, before the fold's transaction,
// with its writes done, after its commit and before the Log has seen it —
// while Saves go on in the other slot, and checks that the log reopens
// with every operation reported durable and the in-flight one all or
// nothing (FORMAT.md "Crash during a checkpoint").
func TestCrashFold(t *testing.T) {
	if os.Getenv(crashDirEnv) != "" {
		t.Skip("in the child")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	rng := crashRNG(t)
	const perStep = 4
	start := time.Now()
	for _, step := range raftlog.FoldSteps {
		t.Run(step, func(t *testing.T) {
			dir := t.TempDir()
			var c crashChecker
			for iter := range perStep {
				lines := runCrashChild(t, dir, rng.Uint64(), step, 0, 0)
				c.check(t, iter, dir, lines)
			}
			if c.kills != perStep {
				t.Errorf("%d kills at %s, want %d", c.kills, step, perStep)
			}
			t.Logf("%s", c)
		})
	}
	t.Logf("%d steps x %d kills in %s", len(raftlog.FoldSteps), perStep, time.Since(start).Round(time.Millisecond))
}

// crashRNG seeds the parent's randomness from RAFTLOG_CRASH_SEED or the
// clock, and prints the seed if the test fails.
func crashRNG(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RAFTLOG_CRASH_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("crash test seed: %d (rerun with RAFTLOG_CRASH_SEED=%d)", seed, seed)
		}
	})
	return rand.New(rand.NewPCG(seed, 1))
}

// runCrashChild runs the workload on dir in a child process and returns the
// lines it printed before it died. With killAt set the child kills itself
// at that rotation step (the parent only waits, up to a deadline);
// otherwise the parent kills it delay after it reported want operations.
func runCrashChild(t *testing.T, dir string, seed uint64, killAt string, want int, delay time.Duration) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, crashSeedEnv+"="+strconv.FormatUint(seed, 10),
		crashKillAtEnv+"="+killAt)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(out)
	var lines []string
	readLine := func() bool {
		s, err := r.ReadString('\n')
		if err != nil {
			return false // a torn last line: the op was not reported
		}
		lines = append(lines, strings.TrimSuffix(s, "\n"))
		return true
	}
	if killAt == "" {
		for s := 0; s < want && readLine(); {
			if lines[len(lines)-1] == "S" {
				s++
			}
		}
		time.Sleep(delay)
		if err := cmd.Process.Kill(); err != nil {
			t.Fatalf("kill: %v", err)
		}
	} else {
		// NB: a deadline, not a wait for state: a child that never reaches
		// the step would otherwise run for its own 20 s limit.
		timer := time.AfterFunc(15*time.Second, func() { _ = cmd.Process.Kill() })
		defer timer.Stop()
	}
	for readLine() { // what the child wrote before it died
	}
	_, _ = io.Copy(io.Discard, out)
	err = cmd.Wait()
	var ee *exec.ExitError
	if killAt != "" {
		if !errors.As(err, &ee) || ee.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("child did not kill itself at step %q: %v (last lines %q)", killAt, err, lastLines(lines, 3))
		}
	}
	return lines
}

func lastLines(lines []string, n int) []string {
	return lines[max(len(lines)-n, 0):]
}

// crashChecker is the independent checker: it replays the child's reported
// operations on a model and compares the reopened log with it.
type crashChecker struct {
	model                                         crashModel
	reported, kills, inflightLanded, inflightLost int
}

func (c crashChecker) String() string {
	return fmt.Sprintf("%d kills, %d operations reported durable, in-flight op landed %d / lost %d, log [%d, %d], snapshot %d",
		c.kills, c.reported, c.inflightLanded, c.inflightLost, c.model.prevIndex+1, c.model.last(), c.model.snapIndex)
}

// check applies the lines of one killed child to the model and compares.
func (c *crashChecker) check(t *testing.T, iter int, dir string, lines []string) {
	t.Helper()
	c.kills++
	var pending *crashOp
	for _, line := range lines {
		switch {
		case strings.HasPrefix(line, "B "):
			op, err := parseCrashOp(line[2:])
			if err != nil {
				t.Fatal(err)
			}
			pending = &op
		case line == "S":
			c.model = c.model.apply(*pending)
			pending = nil
			c.reported++
		case strings.HasPrefix(line, "E "):
			t.Fatalf("iteration %d: workload failed: %s", iter, line)
		}
	}
	l, err := raftlog.Open(dir, raftlog.Options{CacheEntries: -1, RotateFreeRatio: -1})
	if err != nil {
		t.Fatalf("iteration %d: reopen after kill: %v", iter, err)
	}
	d := c.model.diff(l)
	switch {
	case pending == nil:
	case d == "":
		c.inflightLost++
	default:
		next := c.model.apply(*pending)
		if d2 := next.diff(l); d2 == "" {
			c.model, d = next, ""
			c.inflightLanded++
		} else {
			d += fmt.Sprintf("; nor the state after the in-flight op %q: %s", pending.String(), d2)
		}
	}
	mustClose(t, l)
	if d != "" {
		t.Fatalf("iteration %d: after kill the log is not the reported state: %s", iter, d)
	}
}
