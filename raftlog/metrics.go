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
//	save_duration_seconds     histogram  commit + fsync time of one Save
//	entries_appended_total    counter    entries written by Save
//	saves_total               counter    successful Save transactions
//	first_index, last_index   gauge      FirstIndex(), LastIndex()
//	snapshot_index            gauge      index of the current snapshot
//	cached_entries            gauge      entries served from memory
//	file_bytes                gauge      size of raft.db
//	free_pages, pending_pages gauge      bbolt free / pending pages
//	free_bytes                gauge      bytes in free + pending pages
//	freelist_bytes            gauge      size the freelist would have on disk
func NewCollector(l *Log) prometheus.Collector {
	return &collector{l: l}
}

type collector struct{ l *Log }

func desc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName("lodestone", "raftlog", name), help, nil, nil)
}

var (
	descEntriesAppended = desc("entries_appended_total", "Entries written to raft.db by Save.")
	descSaves           = desc("saves_total", "Successful Save transactions (one per Ready with entries or a new hard state).")
	descFirstIndex      = desc("first_index", "First index available from the log (FirstIndex).")
	descLastIndex       = desc("last_index", "Last index in the log (LastIndex).")
	descSnapshotIndex   = desc("snapshot_index", "Index of the current snapshot; 0 if none.")
	descCachedEntries   = desc("cached_entries", "Recent entries served from memory.")
	descFileBytes       = desc("file_bytes", "Size of raft.db on disk in bytes.")
	descFreePages       = desc("free_pages", "bbolt free pages, reusable now.")
	descPendingPages    = desc("pending_pages", "bbolt pages freed by recent transactions, reusable once no reader needs them.")
	descFreeBytes       = desc("free_bytes", "Bytes in bbolt free and pending pages (what rotating raft.db would give back).")
	descFreelistBytes   = desc("freelist_bytes", "Bytes the bbolt freelist would take on disk; never written, since NoFreelistSync is set.")
)

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descEntriesAppended, descSaves, descFirstIndex, descLastIndex, descSnapshotIndex,
		descCachedEntries, descFileBytes, descFreePages, descPendingPages, descFreeBytes, descFreelistBytes,
	} {
		ch <- d
	}
	c.l.saveSeconds.Describe(ch)
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
	gauge(descFirstIndex, float64(s.FirstIndex))
	gauge(descLastIndex, float64(s.LastIndex))
	gauge(descSnapshotIndex, float64(s.SnapshotIndex))
	gauge(descCachedEntries, float64(s.CachedEntries))
	gauge(descFileBytes, float64(s.FileBytes))
	gauge(descFreePages, float64(s.FreePages))
	gauge(descPendingPages, float64(s.PendingPages))
	gauge(descFreeBytes, float64(s.FreeBytes))
	gauge(descFreelistBytes, float64(s.FreelistBytes))
	c.l.saveSeconds.Collect(ch)
}
