package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/tools/compact"
)

type compactOptions struct {
	DataDir  string
	Inspect  bool
	NoBackup bool
	Output   string
}

func newCompactCmd() *cobra.Command {
	var o compactOptions
	cmd := &cobra.Command{
		Use:   "compact --data-dir DIR [--inspect] [--no-backup]",
		Short: "Compact (or inspect) a stopped node's Raft log file",
		Long: `Compact rewrites a stopped node's Raft log (DIR/raft/raft.db) without its free
pages: it copies the live entries and records to a new file with a progress bar
on stderr, verifies the copy against the original (entry count, checksums,
format version, hard state, snapshot record), keeps the original as
raft.db.bak-<timestamp> (unless --no-backup), and swaps the files.

A running server compacts its own log when free pages pass half of a file of
64 MiB or more; use this command on a stopped node, e.g. before restarting one
whose disk is full. It refuses a log a running server holds.

With --inspect it changes nothing and prints the file size, live data, free
pages, freelist size and what one commit writes.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.DataDir == "" {
				return usagef(cmd, "--data-dir is required (the node's --data-dir)")
			}
			if err := checkOutput(cmd, o.Output); err != nil {
				return err
			}
			if o.Inspect && o.NoBackup {
				return usagef(cmd, "--no-backup makes no sense with --inspect, which changes nothing")
			}
			if o.Inspect {
				return runCompactInspect(o, cmd.OutOrStdout())
			}
			return runCompact(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data-dir", "", "the stopped node's --data-dir (its log is DIR/raft/raft.db)")
	f.BoolVar(&o.Inspect, "inspect", false, "only report on the file; change nothing")
	f.BoolVar(&o.NoBackup, "no-backup", false, "do not keep the original file as raft.db.bak-<timestamp>")
	addOutputFlag(cmd, &o.Output)
	return cmd
}

func runCompactInspect(o compactOptions, w io.Writer) error {
	r, err := compact.Inspect(compact.Options{DataDir: o.DataDir})
	if err != nil {
		return err
	}
	return renderInspect(w, o.Output, o.DataDir, r)
}

func runCompact(ctx context.Context, o compactOptions, w, progress io.Writer) error {
	res, err := compact.Run(ctx, compact.Options{DataDir: o.DataDir, NoBackup: o.NoBackup}, progress)
	if err != nil {
		return err
	}
	return renderCompact(w, o.Output, res)
}

type jsonHardState struct {
	Term   uint64 `json:"term"`
	Vote   string `json:"vote"` // member id, hex, as every command shows it
	Commit uint64 `json:"commit"`
}

type jsonSnapshotRef struct {
	Index uint64 `json:"index"`
	Term  uint64 `json:"term"`
}

// jsonInspect is `compact --inspect -o json`.
type jsonInspect struct {
	Path             string          `json:"path"`
	FileBytes        int64           `json:"file_bytes"`
	LiveBytes        int64           `json:"live_bytes"`
	FreePages        int             `json:"free_pages"`
	FreeBytes        int64           `json:"free_bytes"`
	FreeShare        float64         `json:"free_share"`
	FreelistBytes    int64           `json:"freelist_bytes"`
	FreelistWritten  bool            `json:"freelist_written_per_commit"`
	CommitWriteBytes int64           `json:"commit_write_bytes"`
	PageSize         int             `json:"page_size"`
	Entries          uint64          `json:"entries"`
	FirstIndex       uint64          `json:"first_index"`
	LastIndex        uint64          `json:"last_index"`
	JournalRecords   uint64          `json:"journal_records"`
	HardState        jsonHardState   `json:"hard_state"`
	Snapshot         jsonSnapshotRef `json:"snapshot"`
	Compact          bool            `json:"compact_recommended"`
	ReclaimableBytes int64           `json:"reclaimable_bytes"`
}

// renderInspect prints the report as a two-column table (or JSON).
func renderInspect(w io.Writer, format, dataDir string, r compact.Report) error {
	s := r.Summary
	if format == outputJSON {
		return writeJSON(w, jsonInspect{
			Path: r.Path, FileBytes: r.FileBytes, LiveBytes: r.LiveBytes, FreePages: r.FreePages,
			FreeBytes: r.FreeBytes, FreeShare: roundTo(r.FreeShare, 4), FreelistBytes: r.FreelistBytes,
			CommitWriteBytes: r.CommitWriteBytes, PageSize: r.PageSize,
			Entries: s.Entries, FirstIndex: s.FirstIndex, LastIndex: s.LastIndex, JournalRecords: r.JournalRecords,
			HardState: jsonHardState{s.HardState.Term, hexID(s.HardState.Vote), s.HardState.Commit},
			Snapshot:  jsonSnapshotRef{s.SnapshotIndex, s.SnapshotTerm},
			Compact:   r.Compact, ReclaimableBytes: r.Reclaimable,
		})
	}
	tw := newTable(w)
	tw.row("RAFT LOG", r.Path)
	tw.row("FILE SIZE", compact.HumanBytes(r.FileBytes))
	tw.row("LIVE DATA", fmt.Sprintf("%s (%s of the file)", compact.HumanBytes(r.LiveBytes), percent(r.LiveBytes, r.FileBytes)))
	tw.row("FREE PAGES", fmt.Sprintf("%d (%s, %s of the file)", r.FreePages, compact.HumanBytes(r.FreeBytes), percent(r.FreeBytes, r.FileBytes)))
	tw.row("FREELIST SIZE", fmt.Sprintf("%s (never written by a commit: NoFreelistSync)", compact.HumanBytes(r.FreelistBytes)))
	tw.row("ONE COMMIT", fmt.Sprintf("~%s per 16 KiB append (dirty pages + meta page, no freelist)", compact.HumanBytes(r.CommitWriteBytes)))
	entries := "none"
	if s.Entries > 0 {
		entries = fmt.Sprintf("%d [%d, %d], checksums ok", s.Entries, s.FirstIndex, s.LastIndex)
	}
	tw.row("ENTRIES", entries)
	if r.JournalRecords > 0 {
		tw.row("JOURNAL", fmt.Sprintf("%d Saves in raft.wal not yet in raft.db (left by a crash; replayed when the node starts)", r.JournalRecords))
	}
	tw.row("HARD STATE", fmt.Sprintf("term %d, vote %s, commit %d", s.HardState.Term, hexID(s.HardState.Vote), s.HardState.Commit))
	snap := "none"
	if s.SnapshotIndex > 0 {
		snap = fmt.Sprintf("index %d, term %d", s.SnapshotIndex, s.SnapshotTerm)
	}
	tw.row("SNAPSHOT", snap)
	verdict := "ok: no compaction needed"
	if r.Compact {
		verdict = fmt.Sprintf("compact: %s reclaimable; run 'lodestone compact --data-dir %s' (or start the node: it compacts online)",
			compact.HumanBytes(r.Reclaimable), dataDir)
	}
	tw.row("VERDICT", verdict)
	return tw.flush()
}

// jsonCompact is `compact -o json`.
type jsonCompact struct {
	Path        string          `json:"path"`
	BeforeBytes int64           `json:"before_bytes"`
	AfterBytes  int64           `json:"after_bytes"`
	FreedBytes  int64           `json:"freed_bytes"`
	LiveBytes   int64           `json:"live_bytes"`
	Entries     uint64          `json:"entries"`
	FirstIndex  uint64          `json:"first_index"`
	LastIndex   uint64          `json:"last_index"`
	EntriesCRC  string          `json:"entries_crc32c"`
	HardState   jsonHardState   `json:"hard_state"`
	Snapshot    jsonSnapshotRef `json:"snapshot"`
	Verified    bool            `json:"verified"`
	BackupPath  string          `json:"backup_path,omitempty"`
	TookSeconds float64         `json:"took_seconds"`
}

// renderCompact prints what a compaction did as a two-column table (or
// JSON).
func renderCompact(w io.Writer, format string, r compact.Result) error {
	s := r.Summary
	if format == outputJSON {
		return writeJSON(w, jsonCompact{
			Path: r.Path, BeforeBytes: r.BeforeBytes, AfterBytes: r.AfterBytes, FreedBytes: r.FreedBytes,
			LiveBytes: r.LiveBytes, Entries: s.Entries, FirstIndex: s.FirstIndex, LastIndex: s.LastIndex,
			EntriesCRC: fmt.Sprintf("%08x", s.EntriesCRC),
			HardState:  jsonHardState{s.HardState.Term, hexID(s.HardState.Vote), s.HardState.Commit},
			Snapshot:   jsonSnapshotRef{s.SnapshotIndex, s.SnapshotTerm},
			Verified:   true, BackupPath: r.BackupPath, TookSeconds: roundTo(r.Took.Seconds(), 3),
		})
	}
	tw := newTable(w)
	tw.row("RAFT LOG", r.Path)
	tw.row("BEFORE", compact.HumanBytes(r.BeforeBytes))
	tw.row("AFTER", fmt.Sprintf("%s (%s freed; live data %s)", compact.HumanBytes(r.AfterBytes),
		compact.HumanBytes(max(r.FreedBytes, 0)), compact.HumanBytes(r.LiveBytes)))
	entries := "none"
	if s.Entries > 0 {
		entries = fmt.Sprintf("%d [%d, %d]", s.Entries, s.FirstIndex, s.LastIndex)
	}
	tw.row("VERIFIED", fmt.Sprintf("entries %s, checksum %08x, hard state, snapshot record: identical to the original", entries, s.EntriesCRC))
	tw.row("HARD STATE", fmt.Sprintf("term %d, vote %s, commit %d", s.HardState.Term, hexID(s.HardState.Vote), s.HardState.Commit))
	snap := "none"
	if s.SnapshotIndex > 0 {
		snap = fmt.Sprintf("index %d, term %d", s.SnapshotIndex, s.SnapshotTerm)
	}
	tw.row("SNAPSHOT", snap)
	backup := "none (--no-backup)"
	if r.BackupPath != "" {
		backup = r.BackupPath + " (delete it once the node runs well)"
	}
	tw.row("BACKUP", backup)
	tw.row("TOOK", r.Took.Round(time.Millisecond))
	return tw.flush()
}

// percent renders part/whole as "12%".
func percent(part, whole int64) string {
	if whole <= 0 {
		return "0%"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(part)/float64(whole))
}

func roundTo(v float64, decimals int) float64 {
	p := 1.0
	for range decimals {
		p *= 10
	}
	return float64(int64(v*p+0.5)) / p
}
