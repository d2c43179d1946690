package raftlog_test

import (
	"fmt"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
)

// BenchmarkSave measures one Save (a journal record and its fdatasync, and
// every CheckpointBytes a checkpoint's bbolt commit) of batch entries of
// 16 KiB each, the entry size of the Consul outage in Roblox's public
// post-mortem of October 2021 (docs/architecture.md). The log
// is snapshotted and compacted every 4096 entries (outside the timer), as a
// server does, so the file reuses freed pages.
//
// "churned" first pushes 64 MiB through the log and compacts it away, leaving
// thousands of free pages: its ns/op should match the fresh file's, since
// append latency must not depend on how much history the file has seen.
func BenchmarkSave(b *testing.B) {
	for _, bc := range []struct {
		name    string
		batch   int
		churnMB int
	}{
		{"16KiB-x1", 1, 0},
		{"16KiB-x16", 16, 0},
		{"16KiB-x1-churned", 1, 64},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := mustOpen(b, b.TempDir(), raftlog.Options{})
			defer mustClose(b, l)
			data := make([]byte, 16<<10)
			for k := range data {
				data[k] = byte(k * 7)
			}
			next := uint64(1)
			save := func(n int) {
				ents := make([]raftpb.Entry, n)
				for k := range ents {
					ents[k] = raftpb.Entry{Index: next, Term: 1, Data: data}
					next++
				}
				if err := l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: next - 1}, ents); err != nil {
					b.Fatal(err)
				}
			}
			compact := func() {
				if _, err := l.CreateSnapshot(next-1, cs123, nil); err != nil {
					b.Fatal(err)
				}
				if err := l.Compact(next - 1); err != nil {
					b.Fatal(err)
				}
			}
			for range bc.churnMB * 64 / 256 {
				save(256)
			}
			if bc.churnMB > 0 {
				compact()
				save(1)
			}
			b.SetBytes(int64(bc.batch * len(data)))
			b.ReportAllocs()
			b.ResetTimer()
			sinceCompact := 0
			for range b.N {
				save(bc.batch)
				if sinceCompact += bc.batch; sinceCompact >= 4096 {
					b.StopTimer()
					compact()
					sinceCompact = 0
					b.StartTimer()
				}
			}
			b.StopTimer()
			s := l.Stats()
			b.ReportMetric(float64(s.FreePages), "free-pages")
			b.ReportMetric(float64(s.FileBytes)/(1<<20), "file-MiB")
		})
	}
}

// BenchmarkEntries reads 64 consecutive 1 KiB entries, from the cache and
// from bbolt (a lagging follower).
func BenchmarkEntries(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts raftlog.Options
	}{
		{"cached", raftlog.Options{}},
		{"bbolt", raftlog.Options{CacheEntries: -1}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := mustOpen(b, b.TempDir(), bc.opts)
			defer mustClose(b, l)
			data := make([]byte, 1<<10)
			ents := make([]raftpb.Entry, 1024)
			for k := range ents {
				ents[k] = raftpb.Entry{Index: uint64(k + 1), Term: 1, Data: data}
			}
			if err := l.Save(raftpb.HardState{}, ents); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				lo := uint64(1 + i%(1024-64))
				got, err := l.Entries(lo, lo+64, ^uint64(0))
				if err != nil || len(got) != 64 {
					b.Fatal(fmt.Sprint(len(got), err))
				}
			}
		})
	}
}

// BenchmarkOpen measures what a restart's Open does with a log four times
// its cache: every entry checked, the newest CacheBytes of them decoded
// into the cache.
func BenchmarkOpen(b *testing.B) {
	dir, opts := b.TempDir(), raftlog.Options{CacheBytes: 8 << 20}
	l := mustOpen(b, dir, opts)
	data := make([]byte, 16<<10)
	const n = 2048 // 32 MiB of entry data
	for i := uint64(1); i <= n; i += 64 {
		ents := make([]raftpb.Entry, 64)
		for k := range ents {
			ents[k] = raftpb.Entry{Index: i + uint64(k), Term: 1, Data: data}
		}
		if err := l.Save(raftpb.HardState{Term: 1, Commit: i + 63}, ents); err != nil {
			b.Fatal(err)
		}
	}
	mustClose(b, l)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		mustClose(b, mustOpen(b, dir, opts))
	}
}
