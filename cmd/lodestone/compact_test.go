package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/tools/compact"
)

func inspectFixture(bloated bool) compact.Report {
	r := compact.Report{Inspection: raftlog.Inspection{
		Path: "/var/lib/lodestone/raft/raft.db", FileBytes: 4_200_000_000, PageSize: 4096,
		HighWaterBytes: 4_190_000_000, LiveBytes: 489 << 20, FreePages: 897_000, FreeBytes: 897_000 * 4096,
		FreelistBytes: 7_176_024, CommitWriteBytes: 53_248, EntriesDepth: 3,
		Summary: raftlog.LogSummary{Entries: 30_012, FirstIndex: 1_001, LastIndex: 31_012, Version: 1,
			HardState: raftpb.HardState{Term: 5, Vote: 0x1a2b, Commit: 31_012}, CompactedIndex: 1_000, CompactedTerm: 5,
			SnapshotIndex: 1_000, SnapshotTerm: 5},
	}}
	if !bloated {
		r.FileBytes, r.HighWaterBytes, r.FreePages, r.FreeBytes, r.FreelistBytes = 520<<20, 489<<20, 12, 12*4096, 112
	}
	r.FreeShare = float64(r.FreeBytes) / float64(r.FileBytes)
	r.Reclaimable = r.FileBytes - r.LiveBytes
	r.Compact = bloated
	return r
}

func compactFixture(backup bool) compact.Result {
	r := compact.Result{
		Path: "/var/lib/lodestone/raft/raft.db", BeforeBytes: 4_200_000_000, AfterBytes: 510 << 20,
		LiveBytes: 489 << 20, Took: 3210 * time.Millisecond,
		Summary: raftlog.LogSummary{Entries: 30_012, FirstIndex: 1_001, LastIndex: 31_012, EntriesCRC: 0xdeadbeef, Version: 1,
			HardState: raftpb.HardState{Term: 5, Vote: 0x1a2b, Commit: 31_012}, SnapshotIndex: 1_000, SnapshotTerm: 5},
	}
	r.FreedBytes = r.BeforeBytes - r.AfterBytes
	if backup {
		r.BackupPath = r.Path + ".bak-20260304T050607Z"
	}
	return r
}

func TestRenderCompactGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		render func(b *bytes.Buffer) error
	}{
		{"inspect-table-bloated", func(b *bytes.Buffer) error {
			return renderInspect(b, outputTable, "/var/lib/lodestone", inspectFixture(true))
		}},
		{"inspect-table-ok", func(b *bytes.Buffer) error {
			return renderInspect(b, outputTable, "/var/lib/lodestone", inspectFixture(false))
		}},
		{"inspect-json", func(b *bytes.Buffer) error {
			return renderInspect(b, outputJSON, "/var/lib/lodestone", inspectFixture(true))
		}},
		{"table", func(b *bytes.Buffer) error { return renderCompact(b, outputTable, compactFixture(true)) }},
		{"table-no-backup", func(b *bytes.Buffer) error { return renderCompact(b, outputTable, compactFixture(false)) }},
		{"json", func(b *bytes.Buffer) error { return renderCompact(b, outputJSON, compactFixture(true)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.render(&b); err != nil {
				t.Fatal(err)
			}
			golden(t, "compact", tc.name, b.Bytes())
		})
	}
}

// stoppedNode writes a node data dir whose log held 512 entries of 4 KiB and
// was truncated to the last 32.
func stoppedNode(t *testing.T) string {
	t.Helper()
	dataDir := t.TempDir()
	l, err := raftlog.Open(filepath.Join(dataDir, "raft"), raftlog.Options{RotateFreeRatio: -1})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("x"), 4<<10)
	ents := make([]raftpb.Entry, 512)
	for k := range ents {
		ents[k] = raftpb.Entry{Index: uint64(k + 1), Term: 1, Data: data}
	}
	if err := l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: 512}, ents); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateSnapshot(480, &raftpb.ConfState{Voters: []uint64{1}}, []byte("s")); err != nil {
		t.Fatal(err)
	}
	if err := l.Compact(480); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return dataDir
}

func TestCompactCLI(t *testing.T) {
	t.Parallel()
	dataDir := stoppedNode(t)
	r := cli(t, nil, "", "compact", "--inspect", "--data-dir", dataDir).ok(t)
	for _, want := range []string{"FILE SIZE", "LIVE DATA", "FREE PAGES", "FREELIST SIZE", "ONE COMMIT", "32 [481, 512], checksums ok"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("compact --inspect printed %q, want %q in it", r.stdout, want)
		}
	}
	r = cli(t, nil, "", "compact", "--data-dir", dataDir, "-o", "json").ok(t)
	if !strings.Contains(r.stdout, `"entries": 32`) || !strings.Contains(r.stdout, `"verified": true`) {
		t.Errorf("compact -o json printed %q", r.stdout)
	}
	if !strings.Contains(r.stderr, "copying entries") || !strings.Contains(r.stderr, "100%") {
		t.Errorf("compact drew no progress bar on stderr: %q", r.stderr)
	}
	if m, _ := filepath.Glob(filepath.Join(dataDir, "raft", "raft.db.bak-*")); len(m) != 1 {
		t.Errorf("backups %v, want one", m)
	}

	// A log a running server holds is refused with what to do.
	l, err := raftlog.Open(filepath.Join(dataDir, "raft"), raftlog.Options{RotateFreeRatio: -1})
	if err != nil {
		t.Fatal(err)
	}
	cli(t, nil, "", "compact", "--data-dir", dataDir).failed(t, 1,
		"raft log at "+dataDir+" is in use by a running server; stop it first")
	cli(t, nil, "", "compact", "--inspect", "--data-dir", dataDir).failed(t, 1, "in use by a running server; stop it first")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	empty := t.TempDir()
	cli(t, nil, "", "compact", "--data-dir", empty).failed(t, 1, "no raft log at "+empty, "--data-dir")
	if _, err := os.Stat(filepath.Join(empty, "raft")); !os.IsNotExist(err) {
		t.Errorf("compact of an empty data dir created %s/raft", empty)
	}
	cli(t, nil, "", "compact").failed(t, 2, "--data-dir is required")
	cli(t, nil, "", "compact", "--data-dir", dataDir, "--inspect", "--no-backup").failed(t, 2, "--no-backup")
	cli(t, nil, "", "compact", "--data-dir", dataDir, "-o", "yaml").failed(t, 2, `--output "yaml"`)
}
