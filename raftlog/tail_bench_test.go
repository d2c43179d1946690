//go:build linux

package raftlog_test

import (
	"io"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"

	"github.com/lodestone-kv/lodestone/raftlog"
)

// BenchmarkSaveTail measures the tail of single-entry 16 KiB Saves on a
// fresh log: wall time and, robust to a busy machine, the CPU time of the
// thread that runs Save (RUSAGE_THREAD, the goroutine locked to it), which
// counts a checkpoint's bbolt commit only if it runs on the Save path.
// Reported as percentiles over b.N Saves (use -benchtime=Nx, N >= 1000).
func BenchmarkSaveTail(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l := mustOpen(b, b.TempDir(), raftlog.Options{RotateFreeRatio: -1})
	defer mustClose(b, l)
	data := make([]byte, 16<<10)
	for k := range data {
		data[k] = byte(k * 7)
	}
	wall := make([]time.Duration, 0, b.N)
	cpu := make([]time.Duration, 0, b.N)
	threadCPU := func() time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		idx := uint64(i + 1)
		ents := []raftpb.Entry{{Index: idx, Term: 1, Data: data}}
		c0, t0 := threadCPU(), time.Now()
		if err := l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: idx}, ents); err != nil {
			b.Fatal(err)
		}
		wall = append(wall, time.Since(t0))
		cpu = append(cpu, threadCPU()-c0)
	}
	b.StopTimer()
	slices.Sort(wall)
	slices.Sort(cpu)
	pct := func(s []time.Duration, p float64) float64 {
		return float64(s[min(len(s)-1, int(float64(len(s))*p/100))].Microseconds())
	}
	b.ReportMetric(pct(wall, 50), "p50-us")
	b.ReportMetric(pct(wall, 99), "p99-us")
	b.ReportMetric(pct(cpu, 50), "p50-cpu-us")
	b.ReportMetric(pct(cpu, 99), "p99-cpu-us")
	b.ReportMetric(pct(cpu, 100), "max-cpu-us")
}

// BenchmarkSaveTailDuringSnapshots measures the tail of single-entry
// 16 KiB Saves while 64 MiB snapshots of the same log are written back to
// back on another goroutine, as on a server whose --snapshot-bytes comes
// due often: the journal's fdatasyncs share the disk with the snapshot
// file's writeback. Reported as wall-time percentiles over b.N Saves (use
// -benchtime=Nx, N >= 1000) and the snapshots written meanwhile.
func BenchmarkSaveTailDuringSnapshots(b *testing.B) {
	const snapBytes = 64 << 20
	l := mustOpen(b, b.TempDir(), raftlog.Options{RotateFreeRatio: -1})
	defer mustClose(b, l)
	data := make([]byte, 16<<10)
	chunk := make([]byte, 256<<10)
	var committed atomic.Uint64
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n, last := 0, uint64(0)
		for {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			at := committed.Load()
			if at == last {
				runtime.Gosched()
				continue
			}
			_, err := l.CreateSnapshotFrom(at, &raftpb.ConfState{Voters: []uint64{1}}, func(w io.Writer) error {
				for range snapBytes / len(chunk) {
					if _, err := w.Write(chunk); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Error(err)
				done <- n
				return
			}
			n, last = n+1, at
		}
	}()
	wall := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		idx := uint64(i + 1)
		t0 := time.Now()
		if err := l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: idx}, []raftpb.Entry{{Index: idx, Term: 1, Data: data}}); err != nil {
			b.Fatal(err)
		}
		wall = append(wall, time.Since(t0))
		committed.Store(idx)
	}
	b.StopTimer()
	close(stop)
	snaps := <-done
	slices.Sort(wall)
	pct := func(p float64) float64 {
		return float64(wall[min(len(wall)-1, int(float64(len(wall))*p/100))].Microseconds())
	}
	b.ReportMetric(pct(50), "p50-us")
	b.ReportMetric(pct(99), "p99-us")
	b.ReportMetric(pct(100), "max-us")
	b.ReportMetric(float64(snaps), "snapshots")
}
