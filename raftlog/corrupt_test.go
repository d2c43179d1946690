package raftlog_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
)

// These tests damage a closed log on disk and check that Open (or, for the
// snapshot data, Snapshot) refuses it with an error that wraps ErrCorrupt and
// names the file, the record and the index — never serving the damaged data.

// Record encoders written from FORMAT.md, independently of format.go, so the
// document and the code are checked against each other.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func withCRC(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, crc32.Checksum(body, castagnoli)), body...)
}

func entryRecord(t *testing.T, e raftpb.Entry) []byte {
	t.Helper()
	body, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return withCRC(body)
}

func key(i uint64) []byte { return binary.BigEndian.AppendUint64(nil, i) }

// damagedLog builds a log with hard state commit 8, entries 3..10 (1..2
// compacted), a snapshot at 4, then closes it and returns its directory.
func damagedLog(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	l := mustOpen(t, dir, raftlog.Options{})
	if err := l.Save(hardState(3, 1, 8), mkEnts(1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateSnapshot(4, cs123, []byte("state at 4")); err != nil {
		t.Fatal(err)
	}
	if err := l.Compact(2); err != nil {
		t.Fatal(err)
	}
	mustClose(t, l)
	return dir
}

// inBolt runs fn in a write transaction on dir/raft.db, outside raftlog.
func inBolt(t *testing.T, dir string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "raft.db"), 0o600, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

func put(bucket string, k, v []byte) func(tx *bolt.Tx) error {
	return func(tx *bolt.Tx) error { return tx.Bucket([]byte(bucket)).Put(k, v) }
}

func flipLastByte(bucket string, k []byte) func(tx *bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		v := bytes.Clone(b.Get(k))
		v[len(v)-1] ^= 0x40
		return b.Put(k, v)
	}
}

func TestOpenRefusesDamage(t *testing.T) {
	snapFile := filepath.Join("snap", "0000000000000004-0000000000000002.snap")
	tests := []struct {
		name       string
		damage     func(t *testing.T, dir string)
		wantErr    error
		wantFile   string // relative to dir
		wantRecord string
		wantIndex  uint64
	}{
		{
			name:    "entry checksum mismatch",
			damage:  func(t *testing.T, dir string) { inBolt(t, dir, flipLastByte("entries", key(5))) },
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "entry", wantIndex: 5,
		},
		{
			name:    "entry truncated to less than its checksum",
			damage:  func(t *testing.T, dir string) { inBolt(t, dir, put("entries", key(7), []byte{1, 2})) },
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "entry", wantIndex: 7,
		},
		{
			name: "entry missing in the middle",
			damage: func(t *testing.T, dir string) {
				inBolt(t, dir, func(tx *bolt.Tx) error { return tx.Bucket([]byte("entries")).Delete(key(6)) })
			},
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "entry", wantIndex: 6,
		},
		{
			name: "entry stored under the wrong key",
			damage: func(t *testing.T, dir string) {
				inBolt(t, dir, put("entries", key(5), entryRecord(t, mkEnts(6, 2)[0])))
			},
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "entry", wantIndex: 5,
		},
		{
			name: "entry below the compacted index",
			damage: func(t *testing.T, dir string) {
				inBolt(t, dir, put("entries", key(2), entryRecord(t, mkEnts(2, 1)[0])))
			},
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "entry", wantIndex: 2,
		},
		{
			name: "entry term decreases",
			damage: func(t *testing.T, dir string) {
				inBolt(t, dir, put("entries", key(9), entryRecord(t, mkEnts(9, 1)[0])))
			},
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "entry", wantIndex: 9,
		},
		{
			name:    "entry key of the wrong length",
			damage:  func(t *testing.T, dir string) { inBolt(t, dir, put("entries", []byte("abc"), []byte("x"))) },
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "entry",
		},
		{
			name:    "hard state checksum mismatch",
			damage:  func(t *testing.T, dir string) { inBolt(t, dir, flipLastByte("meta", []byte("hardstate"))) },
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "hard state",
		},
		{
			name: "hard state commits beyond the log",
			damage: func(t *testing.T, dir string) {
				hs := hardState(3, 1, 11)
				body, _ := hs.Marshal()
				inBolt(t, dir, put("meta", []byte("hardstate"), withCRC(body)))
			},
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "hard state",
		},
		{
			name:    "compacted record checksum mismatch",
			damage:  func(t *testing.T, dir string) { inBolt(t, dir, flipLastByte("meta", []byte("compacted"))) },
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "compacted",
		},
		{
			name: "compacted past the snapshot",
			damage: func(t *testing.T, dir string) {
				body := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, 5), 2)
				inBolt(t, dir, func(tx *bolt.Tx) error {
					for i := uint64(3); i <= 5; i++ {
						if err := tx.Bucket([]byte("entries")).Delete(key(i)); err != nil {
							return err
						}
					}
					return tx.Bucket([]byte("meta")).Put([]byte("compacted"), withCRC(body))
				})
			},
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "compacted", wantIndex: 5,
		},
		{
			name:    "snapshot record checksum mismatch",
			damage:  func(t *testing.T, dir string) { inBolt(t, dir, flipLastByte("meta", []byte("snapshot"))) },
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "snapshot",
		},
		{
			name:    "version missing",
			damage:  func(t *testing.T, dir string) { inBolt(t, dir, put("meta", []byte("version"), nil)) },
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "version",
		},
		{
			name: "version from the future",
			damage: func(t *testing.T, dir string) {
				inBolt(t, dir, put("meta", []byte("version"), binary.BigEndian.AppendUint64(nil, 4)))
			},
			wantErr: raftlog.ErrUnsupportedVersion,
		},
		{
			name: "meta bucket missing",
			damage: func(t *testing.T, dir string) {
				inBolt(t, dir, func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte("meta")) })
			},
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "bbolt",
		},
		{
			name: "a foreign bbolt file",
			damage: func(t *testing.T, dir string) {
				inBolt(t, dir, func(tx *bolt.Tx) error {
					for _, b := range []string{"meta", "entries"} {
						if err := tx.DeleteBucket([]byte(b)); err != nil {
							return err
						}
					}
					_, err := tx.CreateBucket([]byte("users"))
					return err
				})
			},
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "bbolt",
		},
		{
			name: "snapshot file missing",
			damage: func(t *testing.T, dir string) {
				if err := os.Remove(filepath.Join(dir, snapFile)); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: raftlog.ErrCorrupt, wantFile: snapFile, wantRecord: "snapshot file", wantIndex: 4,
		},
		{
			name: "snapshot file grew",
			damage: func(t *testing.T, dir string) {
				if err := os.WriteFile(filepath.Join(dir, snapFile), []byte("state at 4!"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: raftlog.ErrCorrupt, wantFile: snapFile, wantRecord: "snapshot file", wantIndex: 4,
		},
		{
			name: "bbolt meta pages zeroed",
			damage: func(t *testing.T, dir string) {
				f, err := os.OpenFile(filepath.Join(dir, "raft.db"), os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if _, err := f.WriteAt(make([]byte, 2*os.Getpagesize()), 0); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: raftlog.ErrCorrupt, wantFile: "raft.db", wantRecord: "bbolt",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := damagedLog(t)
			tc.damage(t, dir)
			l, err := raftlog.Open(dir, raftlog.Options{})
			if err == nil {
				mustClose(t, l)
				t.Fatalf("Open succeeded on a damaged log")
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Open error = %v, want %v", err, tc.wantErr)
			}
			if tc.wantFile == "" {
				return
			}
			var ce *raftlog.CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("Open error %v is not a *CorruptError", err)
			}
			if got, want := ce.Path, filepath.Join(dir, tc.wantFile); got != want {
				t.Errorf("Path = %q, want %q", got, want)
			}
			if got, want := ce.Record, tc.wantRecord; got != want {
				t.Errorf("Record = %q, want %q", got, want)
			}
			if got, want := ce.Index, tc.wantIndex; got != want {
				t.Errorf("Index = %d, want %d", got, want)
			}
			if !strings.Contains(err.Error(), ce.Path) {
				t.Errorf("message %q does not name the file", err)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestSnapshotDataDamageNotServed: a snapshot data file with the recorded
// size but other contents passes Open's cheap check and is refused by
// OpenSnapshot's reader, which verifies the CRC at the end of the data.
func TestSnapshotDataDamageNotServed(t *testing.T) {
	dir := damagedLog(t)
	path := filepath.Join(dir, "snap", "0000000000000004-0000000000000002.snap")
	if err := os.WriteFile(path, []byte("state at 5"), 0o600); err != nil {
		t.Fatal(err)
	}
	l := mustOpen(t, dir, raftlog.Options{})
	defer mustClose(t, l)
	snap, err := l.ReadSnapshotData()
	var ce *raftlog.CorruptError
	if !errors.As(err, &ce) || ce.Path != path || ce.Index != 4 {
		t.Fatalf("ReadSnapshotData() = %q, %v; want a CorruptError for %s at index 4", snap.Data, err, path)
	}
}

// TestBitRotInFile flips one byte of an entry's data inside raft.db, as a
// failing disk would, without going through bbolt. Closed: Open refuses the
// file. Open: Entries, reading from bbolt, refuses the entry.
func TestBitRotInFile(t *testing.T) {
	canary := []byte("CANARY-CANARY-CANARY-CANARY")
	write := func(t *testing.T, dir string) *raftlog.Log {
		l := mustOpen(t, dir, raftlog.Options{CacheEntries: -1})
		ents := mkEnts(1, 1, 1, 1, 1, 1)
		ents[3].Data = canary
		if err := l.Save(hardState(1, 1, 5), ents); err != nil {
			t.Fatal(err)
		}
		return l
	}
	rot := func(t *testing.T, dir string) {
		path := filepath.Join(dir, "raft.db")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		off := bytes.Index(b, canary)
		if off < 0 || bytes.Index(b[off+1:], canary) >= 0 {
			t.Fatalf("canary found at %d (want exactly once)", off)
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte{'X'}, int64(off+7)); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("closed", func(t *testing.T) {
		dir := t.TempDir()
		mustClose(t, write(t, dir))
		rot(t, dir)
		_, err := raftlog.Open(dir, raftlog.Options{})
		var ce *raftlog.CorruptError
		if !errors.As(err, &ce) || ce.Index != 4 || ce.Record != "entry" {
			t.Fatalf("Open error = %v, want a CorruptError for entry 4", err)
		}
	})
	t.Run("open", func(t *testing.T) {
		dir := t.TempDir()
		l := write(t, dir)
		defer mustClose(t, l)
		rot(t, dir) // bbolt's read-only shared mapping sees the write
		ents, err := l.Entries(1, 6, ^uint64(0))
		var ce *raftlog.CorruptError
		if !errors.As(err, &ce) || ce.Index != 4 {
			t.Fatalf("Entries = %s, %v; want a CorruptError for entry 4", describe(ents), err)
		}
		if ents, err := l.Entries(1, 4, ^uint64(0)); err != nil || len(ents) != 3 {
			t.Fatalf("Entries(1, 4) = %s, %v; want the 3 intact entries", describe(ents), err)
		}
	})
}

// TestDamagedPagesDoNotCrash is the regression for a crash found by
// tools/compact's tests: bbolt rebuilds the freelist of a NoFreelistSync
// file on a goroutine of its own, where a page whose header was overwritten
// made it panic and kill the process. Open and Inspect must report
// ErrCorrupt instead (FORMAT.md step 1).
func TestDamagedPagesDoNotCrash(t *testing.T) {
	dir := t.TempDir()
	l := mustOpen(t, dir, raftlog.Options{RotateFreeRatio: -1})
	for i := uint64(1); i <= 2000; i += 100 {
		terms := make([]uint64, 100)
		for k := range terms {
			terms[k] = 1
		}
		if err := l.Save(hardState(1, 1, i+99), mkEnts(i, terms...)); err != nil {
			t.Fatal(err)
		}
	}
	mustClose(t, l)
	path := filepath.Join(dir, "raft.db")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xAB}, 64<<10), fi.Size()/4); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := raftlog.Open(dir, raftlog.Options{}); !errors.Is(err, raftlog.ErrCorrupt) {
		t.Errorf("Open = %v, want ErrCorrupt", err)
	}
	if _, err := raftlog.Inspect(dir, time.Second); !errors.Is(err, raftlog.ErrCorrupt) {
		t.Errorf("Inspect = %v, want ErrCorrupt", err)
	}
}
