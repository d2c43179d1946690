package watch_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/lodestone-kv/lodestone/watch"
	"github.com/lodestone-kv/lodestone/watch/watchtest"
)

// TestDataDriven runs the scripts in testdata/ against a manual Hub (no
// goroutines: shards move only on sync, so every interleaving is spelled
// out). Log lines the hub emits during a command are part of its output.
// Rerun with -rewrite to regenerate, and commit the diff only if you can
// explain it.
//
// The DSL:
//
//	new [shards=N] [buffer=N] [retain=N] [retain-bytes=N]
//	    A fresh hub (defaults: 1 shard, buffer 4, retain 100 events).
//	watch name=W key=K [prefix] [start=N|now] [noput] [nodelete] [prevkv] [buffer=N]
//	    Subscribe; prints the shard or the error.
//	publish index=N [nosync]
//	put KEY=VALUE [prev=VALUE]
//	del KEY [prev=VALUE]
//	    Publish one index with the events listed in the input (none: an
//	    empty index), then sync the shards unless nosync.
//	sync
//	    Let every shard apply the whole log.
//	next name=W
//	    Poll W without blocking: every ready batch, then its terminal error
//	    (or "nothing" when there was nothing).
//	progress
//	    Sync, then run a progress round on every shard.
//	restore index=N
//	close name=W
//	stats
//	    Hub index, oldest resumable index, retained entries/events, watchers
//	    per shard.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var (
			h        *watch.Hub
			watchers map[string]*watch.Watcher
			logBuf   bytes.Buffer
		)
		defer func() {
			if h != nil {
				h.Close()
			}
		}()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var out strings.Builder
			switch d.Cmd {
			case "new":
				if h != nil {
					h.Close()
				}
				cfg := watch.Config{
					Shards:           1,
					WatcherBuffer:    4,
					RetainEvents:     100,
					ProgressInterval: -1,
					Clock:            watchtest.NewClock(time.Unix(0, 0)),
					Logger:           testLogger(&logBuf),
				}
				d.MaybeScanArgs(t, "shards", &cfg.Shards)
				d.MaybeScanArgs(t, "buffer", &cfg.WatcherBuffer)
				d.MaybeScanArgs(t, "retain", &cfg.RetainEvents)
				d.MaybeScanArgs(t, "retain-bytes", &cfg.RetainBytes)
				var err error
				h, err = watch.NewManual(cfg)
				if err != nil {
					return err.Error()
				}
				watchers = map[string]*watch.Watcher{}
				out.WriteString("ok\n")
			case "watch":
				var name string
				var req watch.Request
				d.ScanArgs(t, "name", &name)
				d.MaybeScanArgs(t, "key", &req.Key)
				d.MaybeScanArgs(t, "start", &req.StartIndex)
				d.MaybeScanArgs(t, "buffer", &req.BufferSize)
				req.Prefix = d.HasArg("prefix")
				req.FromNow = d.HasArg("now")
				req.NoPut = d.HasArg("noput")
				req.NoDelete = d.HasArg("nodelete")
				req.PrevKV = d.HasArg("prevkv")
				w, err := h.Watch(context.Background(), req)
				if err != nil {
					fmt.Fprintf(&out, "%s: error: %v\n", name, err)
					break
				}
				watchers[name] = w
				fmt.Fprintf(&out, "%s: watching (shard %d)\n", name, w.ShardOf())
			case "publish":
				var index uint64
				d.ScanArgs(t, "index", &index)
				h.Publish(index, parseEvents(t, d, index))
				if !d.HasArg("nosync") {
					h.Sync()
				}
			case "sync":
				h.Sync()
			case "next":
				var name string
				d.ScanArgs(t, "name", &name)
				w := watchers[name]
				if w == nil {
					d.Fatalf(t, "no watcher %q", name)
				}
				printed := false
				for {
					b, err := w.Next(doneCtx)
					if errors.Is(err, context.Canceled) {
						if !printed {
							fmt.Fprintf(&out, "%s: nothing\n", name)
						}
						break
					}
					printed = true
					if err != nil {
						fmt.Fprintf(&out, "%s: error: %v\n", name, err)
						break
					}
					fmt.Fprintf(&out, "%s: %s\n", name, formatBatch(b))
				}
			case "progress":
				h.Progress()
			case "restore":
				var index uint64
				d.ScanArgs(t, "index", &index)
				h.Restore(index)
				h.Sync()
			case "close":
				var name string
				d.ScanArgs(t, "name", &name)
				watchers[name].Close()
			case "stats":
				entries, events, floor, last := h.Retained()
				fmt.Fprintf(&out, "index=%d oldest=%d retained-entries=%d retained-events=%d watchers=%v\n",
					last, floor, entries, events, h.ShardWatchers())
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			out.Write(logBuf.Bytes())
			logBuf.Reset()
			if out.Len() == 0 {
				return "ok\n"
			}
			return out.String()
		})
	})
}

// testLogger logs at Debug without timestamps, so logs can be golden.
func testLogger(buf *bytes.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	}))
}

func parseEvents(t *testing.T, d *datadriven.TestData, index uint64) []watch.Event {
	var evs []watch.Event
	for _, line := range strings.Split(d.Input, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var ev watch.Event
		switch f[0] {
		case "put":
			ev.Type = watch.Put
			k, v, _ := strings.Cut(f[1], "=")
			ev.KV = watch.KeyValue{Key: k, Value: []byte(v), ModifyIndex: index}
		case "del":
			ev.Type = watch.Delete
			ev.KV = watch.KeyValue{Key: f[1], ModifyIndex: index}
		default:
			d.Fatalf(t, "bad event %q", line)
		}
		for _, a := range f[2:] {
			if p, ok := strings.CutPrefix(a, "prev="); ok {
				ev.PrevKV = &watch.KeyValue{Key: ev.KV.Key, Value: []byte(p)}
			}
		}
		evs = append(evs, ev)
	}
	return evs
}

func formatEvent(ev watch.Event) string {
	var s string
	switch ev.Type {
	case watch.Put:
		s = fmt.Sprintf("put %s=%s@%d", ev.KV.Key, ev.KV.Value, ev.Index)
	case watch.Delete:
		s = fmt.Sprintf("del %s@%d", ev.KV.Key, ev.Index)
	}
	if ev.PrevKV != nil {
		s += fmt.Sprintf("(prev=%s)", ev.PrevKV.Value)
	}
	return s
}

func formatBatch(b watch.Batch) string {
	if b.IsProgress() {
		return fmt.Sprintf("progress index=%d", b.Index)
	}
	parts := make([]string, len(b.Events))
	for i, ev := range b.Events {
		parts[i] = formatEvent(ev)
	}
	return fmt.Sprintf("index=%d [%s]", b.Index, strings.Join(parts, " "))
}
