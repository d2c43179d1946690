package raftlog

import "github.com/prometheus/client_golang/prometheus"

// NewCollector returns a collector that exports l's metrics. Nothing is
// registered globally: the caller registers it on its own registry, and wraps
// it with prometheus.WrapCollectorWith to add labels (e.g. the node name)
// when one process holds several logs. Gauges are read from Stats at scrape
// time; the save latency histogram is fed by every Save.
//
// Exported series (namespace lodestone, subsystem raftlog):
//
//	save_duration_seconds          histogram  time to make one Save durable (journal record or checkpoint)
//	commit_write_bytes             histogram  bytes one Save wrote (its raft.wal record, or a checkpoint's pages)
//	last_commit_write_bytes        gauge      the same for the last Save
//	entries_appended_total         counter    entries written by Save (to raft.wal or raft.db)
//	saves_total                    counter    successful Saves
//	checkpoints_total              counter    folds of the journal (raft.wal) into raft.db
//	checkpoint_waits_total         counter    Saves that waited for the previous background checkpoint
//	checkpoint_deferrals_total     counter    Saves that went on in a due epoch while the previous checkpoint ran
//	checkpoint_in_progress         gauge      1 while a checkpoint runs in the background
//	checkpoint_duration_seconds    histogram  time of each background checkpoint
//	journal_bytes                  gauge      bytes of raft.wal holding records raft.db lacks
//	first_index, last_index        gauge      FirstIndex(), LastIndex()
//	snapshot_index                 gauge      index of the current snapshot
//	cached_entries                 gauge      entries served from memory
//	file_bytes                     gauge      size of raft.db
//	live_bytes                     gauge      bytes of raft.db holding data
//	free_pages, pending_pages      gauge      bbolt free / pending pages
//	free_bytes                     gauge      bytes in free + pending pages
//	freelist_bytes                 gauge      size the freelist would have on disk
//	rotations_total                counter    completed rotations of raft.db
//	rotation_failures_total        counter    failed rotations (old file kept)
//	rotation_in_progress           gauge      1 while a rotation runs
//	rotation_pause_seconds         histogram  write-lock time of each rotation
//	last_rotation_duration_seconds gauge      start to swap of the last rotation
func NewCollector(l *Log) prometheus.Collector {
	return &collector{l: l}
}

type collector struct{ l *Log }

func desc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName("lodestone", "raftlog", name), help, nil, nil)
}

var (
	descEntriesAppended  = desc("entries_appended_total", "Entries written by Save, to the journal (raft.wal) or raft.db.")
	descSaves            = desc("saves_total", "Successful Saves (one per Ready with entries or a new hard state).")
	descCheckpoints      = desc("checkpoints_total", "Folds of the journal (raft.wal) into raft.db, each one bbolt commit.")
	descCheckpointWaits  = desc("checkpoint_waits_total", "Saves that found the journal due for a checkpoint while the previous one still ran in the background, and waited for it.")
	descCheckpointDefer  = desc("checkpoint_deferrals_total", "Saves that found the journal due for a checkpoint while the previous one still ran in the background, and went on in the same epoch instead of waiting (up to its slot and a quarter of the log cache).")
	descCheckpointActive = desc("checkpoint_in_progress", "1 while a checkpoint (a journal epoch folded into raft.db) runs in the background, else 0.")
	descJournalBytes     = desc("journal_bytes", "Bytes of the journal (raft.wal) holding records raft.db lacks; replayed at the next Open.")
	descFirstIndex       = desc("first_index", "First index available from the log (FirstIndex).")
	descLastIndex        = desc("last_index", "Last index in the log (LastIndex).")
	descSnapshotIndex    = desc("snapshot_index", "Index of the current snapshot; 0 if none.")
	descCachedEntries    = desc("cached_entries", "Recent entries served from memory.")
	descFileBytes        = desc("file_bytes", "Size of raft.db on disk in bytes.")
	descLiveBytes        = desc("live_bytes", "Bytes of raft.db holding data: bbolt's high-water mark minus free and pending pages.")
	descFreePages        = desc("free_pages", "bbolt free pages, reusable now.")
	descPendingPages     = desc("pending_pages", "bbolt pages freed by recent transactions, reusable once no reader needs them.")
	descFreeBytes        = desc("free_bytes", "Bytes in bbolt free and pending pages (what rotating raft.db would give back).")
	descFreelistBytes    = desc("freelist_bytes", "Bytes the bbolt freelist would take on disk; never written, since NoFreelistSync is set.")
	descLastCommitWrite  = desc("last_commit_write_bytes", "Bytes the last Save wrote: the raft.wal space its record takes, or its raft.db commit's dirty pages plus the meta page.")
	descRotations        = desc("rotations_total", "Completed online rotations (compactions) of raft.db.")
	descRotationFailures = desc("rotation_failures_total", "Rotations of raft.db that failed; the old file stayed in use.")
	descRotating         = desc("rotation_in_progress", "1 while a rotation of raft.db is copying or swapping, else 0.")
	descLastRotationTook = desc("last_rotation_duration_seconds", "Duration of the last rotation from start to swap.")
)

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descEntriesAppended, descSaves, descCheckpoints, descCheckpointWaits, descCheckpointDefer, descCheckpointActive, descJournalBytes, descFirstIndex, descLastIndex, descSnapshotIndex,
		descCachedEntries, descFileBytes, descLiveBytes, descFreePages, descPendingPages, descFreeBytes,
		descFreelistBytes, descLastCommitWrite, descRotations, descRotationFailures, descRotating,
		descLastRotationTook,
	} {
		ch <- d
	}
	c.l.saveSeconds.Describe(ch)
	c.l.commitWriteBytes.Describe(ch)
	c.l.rotatePause.Describe(ch)
	c.l.checkpointSeconds.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.l.Stats()
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter(descEntriesAppended, float64(s.EntriesAppended))
	counter(descSaves, float64(s.Commits))
	counter(descCheckpoints, float64(s.Checkpoints))
	counter(descCheckpointWaits, float64(s.CheckpointWaits))
	counter(descCheckpointDefer, float64(s.CheckpointDeferrals))
	checkpointing := 0.0
	if s.CheckpointInProgress {
		checkpointing = 1
	}
	gauge(descCheckpointActive, checkpointing)
	gauge(descJournalBytes, float64(s.JournalBytes))
	gauge(descFirstIndex, float64(s.FirstIndex))
	gauge(descLastIndex, float64(s.LastIndex))
	gauge(descSnapshotIndex, float64(s.SnapshotIndex))
	gauge(descCachedEntries, float64(s.CachedEntries))
	gauge(descFileBytes, float64(s.FileBytes))
	gauge(descLiveBytes, float64(s.LiveBytes))
	gauge(descFreePages, float64(s.FreePages))
	gauge(descPendingPages, float64(s.PendingPages))
	gauge(descFreeBytes, float64(s.FreeBytes))
	gauge(descFreelistBytes, float64(s.FreelistBytes))
	gauge(descLastCommitWrite, float64(s.LastCommitWriteBytes))
	counter(descRotations, float64(s.Rotations))
	counter(descRotationFailures, float64(s.RotationFailures))
	rotating := 0.0
	if s.Rotating {
		rotating = 1
	}
	gauge(descRotating, rotating)
	gauge(descLastRotationTook, s.LastRotationDuration.Seconds())
	c.l.saveSeconds.Collect(ch)
	c.l.commitWriteBytes.Collect(ch)
	c.l.rotatePause.Collect(ch)
	c.l.checkpointSeconds.Collect(ch)
}
