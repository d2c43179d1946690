package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client/clienttest"
)

// watchFixture is a fixed event sequence for the render goldens: puts with
// text, long, control-character and binary values, a delete, and a key
// that needs quoting.
func watchFixture() []*lodestonepb.Event {
	put := func(key, value string, create, modify uint64) *lodestonepb.Event {
		return &lodestonepb.Event{Type: lodestonepb.Event_PUT, Kv: &lodestonepb.KeyValue{
			Key: []byte(key), Value: []byte(value), CreateIndex: create, ModifyIndex: modify}}
	}
	return []*lodestonepb.Event{
		put("svc/web/1", "10.0.0.1:8080", 12, 12),
		put("svc/web/2", "a long message of the day that goes on past the preview", 13, 13),
		put("svc/web/1", "col1\tcol2\n", 12, 14),
		put("svc/bin", "\xff\x00\x01\x02", 15, 15),
		{Type: lodestonepb.Event_DELETE, Kv: &lodestonepb.KeyValue{Key: []byte("svc/web/2"), ModifyIndex: 16}},
		put("svc/odd key\n", "", 17, 17),
	}
}

func TestRenderKVWatchGolden(t *testing.T) {
	for _, tc := range []struct {
		name     string
		format   string
		keysOnly bool
	}{
		{"table", outputTable, false},
		{"keys-only", outputTable, true},
		{"json", outputJSON, false},
		{"json-keys-only", outputJSON, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			for _, ev := range watchFixture() {
				if err := renderWatchEvent(&b, tc.format, ev, tc.keysOnly); err != nil {
					t.Fatal(err)
				}
			}
			if n := strings.Count(b.String(), "\n"); n != len(watchFixture()) {
				t.Errorf("%d lines for %d events, want one per event", n, len(watchFixture()))
			}
			golden(t, "kv-watch", tc.name, b.Bytes())
		})
	}
}

// watchCLI runs `lodestone kv watch` with args against endpoint until it
// has printed n lines, then interrupts it as Ctrl-C would, and returns the
// lines and the exit code.
func watchCLI(t *testing.T, endpoint string, n int, args ...string) ([]string, int, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		code := run(ctx, append([]string{"--endpoints", endpoint, "kv", "watch"}, args...), strings.NewReader(""), pw, &errb,
			func(string) string { return "" })
		pw.Close()
		done <- code
	}()
	var lines []string
	sc := bufio.NewScanner(pr)
	for len(lines) < n && sc.Scan() {
		lines = append(lines, sc.Text())
	}
	cancel()
	go io.Copy(io.Discard, pr) // let run finish writing, if it still does
	select {
	case code := <-done:
		return lines, code, errb.String()
	case <-time.After(10 * time.Second):
		t.Fatal("kv watch did not stop after the interrupt")
		return nil, 0, ""
	}
}

// The watch prints every change under the prefix after --from-index, one
// line each, survives a broken stream without a gap or a duplicate, and
// exits 0 on Ctrl-C.
func TestKVWatchCLI(t *testing.T) {
	t.Parallel()
	l := clienttest.NewWatchLog()
	l.SetFaults(clienttest.WatchFaults{BreakAfterEvents: 3, MaxEventsPerResponse: 1})
	srv := clienttest.Start(t, l.Funcs())
	start := l.Put("svc/web/0", "old")
	for i := 1; i <= 4; i++ {
		l.Put(fmt.Sprintf("svc/web/%d", i), fmt.Sprintf("10.0.0.%d", i))
		l.Put("other/x", "ignored")
	}
	l.Delete("svc/web/2")

	want := l.Events("svc/web/", true, start)
	lines, code, stderr := watchCLI(t, srv.Addr, len(want), "svc/web/", "--from-index", fmt.Sprint(start), "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d after Ctrl-C, want 0; stderr %q", code, stderr)
	}
	if len(lines) != len(want) {
		t.Fatalf("printed %d lines, want %d: %q", len(lines), len(want), lines)
	}
	for i, line := range lines {
		var got jsonEvent
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("line %d %q: %v", i, line, err)
		}
		if got.Key != string(want[i].GetKv().GetKey()) || got.ModifyIndex != want[i].GetKv().GetModifyIndex() {
			t.Errorf("line %d = %s %s@%d, want %s@%d", i, got.Type, got.Key, got.ModifyIndex,
				want[i].GetKv().GetKey(), want[i].GetKv().GetModifyIndex())
		}
	}
	if l.Streams() < 2 {
		t.Errorf("streams = %d, want a resume after the fault broke the first", l.Streams())
	}

	// --exact: only the key itself.
	lines, code, _ = watchCLI(t, srv.Addr, 1, "svc/web/1", "--exact", "--from-index", fmt.Sprint(start))
	if code != 0 || len(lines) != 1 || !strings.HasPrefix(lines[0], "put    svc/web/1 ") {
		t.Errorf("--exact printed %q (exit %d), want the one put of svc/web/1", lines, code)
	}
}

func TestKVWatchErrors(t *testing.T) {
	t.Parallel()
	l := clienttest.NewWatchLog()
	srv := clienttest.Start(t, l.Funcs())
	for i := 0; i < 20; i++ {
		l.Put("k", "v")
	}
	l.Compact(10)
	r := cli(t, nil, "", "--endpoints", srv.Addr, "kv", "watch", "k", "--from-index", "3")
	r.failed(t, 1, "compacted", "lodestone kv list k", "--from-index")

	r = cli(t, nil, "", "kv", "watch", "", "--exact")
	r.failed(t, 2, "--exact needs a non-empty key")

	r = cli(t, nil, "", "kv", "watch", "k", "--from", "nearest")
	r.failed(t, 2, "--from", "want followers or leader")

	down := clienttest.Start(t, &clienttest.Funcs{}) // serves no Watch
	r = cli(t, nil, "", "--endpoints", down.Addr, "kv", "watch", "k")
	r.failed(t, 1, "unimplemented")
}
