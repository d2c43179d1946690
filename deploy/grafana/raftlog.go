package grafana

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

// raftLog shows the durable Raft log of each server: whether raft.db is
// bloated with free pages (raft-log-bloat.md), what each commit writes,
// and rotation.
func raftLog() *dashboard.DashboardBuilder {
	b := newDashboard("lodestone-raft-log", "Lodestone / Raft log",
		"raft.db's size, live data and free pages, bytes written per commit, the journal, online rotation and the log's index range (docs/runbooks/raft-log-bloat.md).")
	variables(b, "lodestone_raftlog_file_bytes", "Servers")

	row(b, "raft.db",
		graph("File size, live data, free", "Size of raft.db, the bytes holding data, and the bytes in free and pending pages (what a rotation gives back).", "bytes",
			q(sel("lodestone_raftlog_file_bytes"), "{{instance}} file"),
			q(sel("lodestone_raftlog_live_bytes"), "{{instance}} live"),
			q(sel("lodestone_raftlog_free_bytes"), "{{instance}} free")),
		graph("Free share of raft.db", "Free bytes over file size. A server rotates a file of 64 MiB or more once this passes 50%; above 80% for 30 minutes rotation is not keeping up: raft-log-bloat.md.", "percentunit",
			q(sel("lodestone_raftlog_free_bytes")+" / "+sel("lodestone_raftlog_file_bytes"), "{{instance}}")).
			Min(0).Max(1).
			Thresholds(thresholds(nil, "green", 0.5, "orange", 0.8, "red")),
		graph("Free and pending pages", "bbolt pages free now, and pages freed by recent commits that become free once no reader needs them.", "none",
			q(sel("lodestone_raftlog_free_pages"), "{{instance}} free"),
			q(sel("lodestone_raftlog_pending_pages"), "{{instance}} pending")),
		graph("Freelist size", "What the freelist would take on disk. Never written (NoFreelistSync): in the outage this was 7.8 MB rewritten by every commit; here it costs nothing.", "bytes",
			q(sel("lodestone_raftlog_freelist_bytes"), "{{instance}}")),
	)

	row(b, "Writes",
		graph("Bytes written per commit", "The last Save's bytes, and the mean per Save: the journal record, or the raft.db commit's dirty pages when it checkpoints. Must stay flat whatever the file's history.", "bytes",
			q(sel("lodestone_raftlog_last_commit_write_bytes"), "{{instance}} last"),
			q(rate(sel("lodestone_raftlog_commit_write_bytes_sum"))+" / "+rate(sel("lodestone_raftlog_commit_write_bytes_count")), "{{instance}} mean")),
		graph("Save duration p99", "Making one Ready's entries and hard state durable: the journal record written and fdatasynced, or the raft.db commit.", "s",
			q(sel("instance:lodestone_raftlog_save_duration_seconds:p99"), "{{instance}}")).
			Thresholds(thresholds(nil, "green", 0.5, "red")),
		graph("Saves and entries appended", "Saves per second (one per Ready) and entries they wrote.", "ops",
			q(rate(sel("lodestone_raftlog_saves_total")), "{{instance}} saves"),
			q(rate(sel("lodestone_raftlog_entries_appended_total")), "{{instance}} entries")),
		graph("Journal", "Bytes of raft.wal not yet folded into raft.db (replayed at the next open), and checkpoints: folds of the journal into raft.db, each one bbolt commit.", "bytes",
			q(sel("lodestone_raftlog_journal_bytes"), "{{instance}} journal bytes"),
			q(`increase(`+sel("lodestone_raftlog_checkpoints_total")+`[$__rate_interval])`, "{{instance}} checkpoints")),
	)

	row(b, "Rotation",
		graph("Rotations and failures (per hour)", "Completed online rotations of raft.db, and failed ones (the old file stays; the server log says why).", "none",
			q(`increase(`+sel("lodestone_raftlog_rotations_total")+`[1h])`, "{{instance}} rotations"),
			q(`increase(`+sel("lodestone_raftlog_rotation_failures_total")+`[1h])`, "{{instance}} failures")),
		graph("Rotation in progress", "1 while a rotation copies live entries to a new file or swaps it in; writes continue meanwhile.", "none",
			q(sel("lodestone_raftlog_rotation_in_progress"), "{{instance}}")).Min(0).Max(1),
		graph("Rotation durations", "The last rotation from start to swap (grows with live data, not file size), and the longest write pause a rotation took in the last hour.", "s",
			q(sel("lodestone_raftlog_last_rotation_duration_seconds"), "{{instance}} last rotation"),
			q(`histogram_quantile(1, sum by (instance, le) (increase(`+sel("lodestone_raftlog_rotation_pause_seconds_bucket")+`[1h])))`, "{{instance}} max pause (1h)")),
	)

	row(b, "Log range and snapshots",
		graph("Log index range", "First and last index in the log, and the snapshot's index: the log is truncated behind each snapshot.", "none",
			q(sel("lodestone_raftlog_first_index"), "{{instance}} first"),
			q(sel("lodestone_raftlog_last_index"), "{{instance}} last"),
			q(sel("lodestone_raftlog_snapshot_index"), "{{instance}} snapshot")),
		graph("Snapshots", "State machine snapshots taken per hour, and the newest one's index.", "none",
			q(`increase(`+sel("lodestone_snapshots_total")+`[1h])`, "{{instance}} taken (1h)"),
			q(sel("lodestone_snapshot_index"), "{{instance}} index")),
		graph("Entries cached", "Recent entries the log serves from memory.", "none",
			q(sel("lodestone_raftlog_cached_entries"), "{{instance}}")),
	)
	return b
}
