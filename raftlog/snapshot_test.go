package raftlog_test

import (
	"bytes"
	"errors"
	"hash/crc32"
	"io"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"weak"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/raftlog/raftlogtest"
)

// TestSnapshotDataNotRetained: neither CreateSnapshot nor ApplySnapshot
// keeps the data they were given, Snapshot carries metadata only, and
// OpenSnapshot reads the data back from the file, also after a reopen.
func TestSnapshotDataNotRetained(t *testing.T) {
	l, dir := seeded(t, raftlog.Options{})
	data := bytes.Repeat([]byte("created "), 1<<17) // 1 MiB
	want := bytes.Clone(data)
	gone := weak.Make(&data[0])
	if _, err := l.CreateSnapshot(8, cs123, data); err != nil {
		t.Fatal(err)
	}
	data = nil
	runtime.GC()
	if gone.Value() != nil {
		t.Fatal("the Log still references the data given to CreateSnapshot")
	}
	assertSnapshot(t, l, 8, want)

	leader := bytes.Repeat([]byte("leader's"), 1<<17)
	wantLeader := bytes.Clone(leader)
	gone = weak.Make(&leader[0])
	snap := raftpb.Snapshot{Data: leader, Metadata: raftpb.SnapshotMetadata{Index: 20, Term: 4, ConfState: *cs123}}
	if err := l.ApplySnapshot(snap); err != nil {
		t.Fatal(err)
	}
	snap, leader = raftpb.Snapshot{}, nil
	runtime.GC()
	if gone.Value() != nil {
		t.Fatal("the Log still references the data given to ApplySnapshot")
	}
	assertSnapshot(t, l, 20, wantLeader)
	mustClose(t, l)

	l = mustOpen(t, dir, raftlog.Options{})
	defer mustClose(t, l)
	assertSnapshot(t, l, 20, wantLeader)
}

// TestCreateSnapshotFromStreams: a snapshot written through
// CreateSnapshotFrom is never whole in the heap, nor held after it.
func TestCreateSnapshotFromStreams(t *testing.T) {
	const size = 64 << 20
	l, _ := seeded(t, raftlog.Options{})
	defer mustClose(t, l)
	chunk := bytes.Repeat([]byte{0xa5}, 64<<10)
	var crc uint32
	for range size / len(chunk) {
		crc = crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), chunk)
	}
	before := heapInUse()
	var peak uint64
	_, err := l.CreateSnapshotFrom(8, cs123, func(w io.Writer) error {
		for k := range size / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return err
			}
			if k == size/len(chunk)/2 {
				peak = heapInUse()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	after := heapInUse()
	// NB: a quarter of the data: far below one copy, far above the write
	// buffer.
	if peak > before+size/4 || after > before+size/4 {
		t.Errorf("heap in use %d before, %d while writing, %d after a %d-byte snapshot", before, peak, after, size)
	}
	r, err := l.OpenSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	n, err := io.Copy(h, r)
	if err != nil || n != size || h.Sum32() != crc {
		t.Fatalf("read back %d bytes, crc %#x, %v; want %d, %#x", n, h.Sum32(), err, size, crc)
	}
}

// TestSnapshotFileSyncsInSteps: a large snapshot data file is fsynced as
// it is written, not only at the end, and a failed fsync on the way fails
// the snapshot and changes nothing.
func TestSnapshotFileSyncsInSteps(t *testing.T) {
	const size = 10 << 20
	ffs := &raftlogtest.FaultFS{}
	dir := t.TempDir()
	l := mustOpen(t, dir, raftlog.Options{FS: ffs})
	defer mustClose(t, l)
	mustSave(t, l, hardState(1, 1, 8), mkEnts(1, 1, 1, 1, 1, 1, 1, 1, 1))
	chunk := bytes.Repeat([]byte{0x5a}, 64<<10)
	write := func(w io.Writer) error {
		for range size / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return err
			}
		}
		return nil
	}
	var syncs atomic.Int64
	snapDir := filepath.Join(dir, "snap")
	ffs.Fail = func(op raftlogtest.Op, path string) error {
		if op == raftlogtest.OpSync && strings.HasPrefix(path, snapDir) {
			if syncs.Add(1) == 2 {
				return errInjected
			}
		}
		return nil
	}
	if _, err := l.CreateSnapshotFrom(4, cs123, write); !errors.Is(err, errInjected) {
		t.Fatalf("CreateSnapshotFrom with its second fsync failing: %v, want the injected error", err)
	}
	if s, err := l.Snapshot(); err != nil || s.Metadata.Index != 0 {
		t.Fatalf("after the failed snapshot: Snapshot() = %d, %v; want none", s.Metadata.Index, err)
	}
	syncs.Store(10) // no more failures
	if _, err := l.CreateSnapshotFrom(8, cs123, write); err != nil {
		t.Fatal(err)
	}
	// 10 MiB: fsyncs after 4 and 8 MiB, then the final one.
	if got := syncs.Load() - 10; got != 3 {
		t.Errorf("a %d-byte snapshot file was fsynced %d times, want 3", size, got)
	}
}

// TestCreateSnapshotFromWriteError: a failing writer leaves no snapshot and
// a writable log.
func TestCreateSnapshotFromWriteError(t *testing.T) {
	l, dir := seeded(t, raftlog.Options{})
	defer mustClose(t, l)
	before := snapFiles(t, dir)
	boom := errors.New("encoder failed")
	_, err := l.CreateSnapshotFrom(8, cs123, func(w io.Writer) error {
		_, _ = w.Write([]byte("partial"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("CreateSnapshotFrom = %v, want %v", err, boom)
	}
	if after := snapFiles(t, dir); !equalStrings(after, before) {
		t.Errorf("snapshot files %v, want %v", after, before)
	}
	assertSnapshot(t, l, 6, []byte("state at 6"))
	if _, err := l.CreateSnapshot(8, cs123, []byte("state at 8")); err != nil {
		t.Fatalf("after a failed write: %v", err)
	}
}

func assertSnapshot(t *testing.T, l *raftlog.Log, index uint64, data []byte) {
	t.Helper()
	snap, err := l.Snapshot()
	if err != nil || snap.Metadata.Index != index || snap.Data != nil {
		t.Fatalf("Snapshot() = index %d, %d bytes, %v; want index %d, no data", snap.Metadata.Index, len(snap.Data), err, index)
	}
	full, err := l.ReadSnapshotData()
	if err != nil || full.Metadata.Index != index || !bytes.Equal(full.Data, data) {
		t.Fatalf("ReadSnapshotData() = index %d, %d bytes, %v; want index %d, %d bytes", full.Metadata.Index, len(full.Data), err, index, len(data))
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}
