package harness

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Scrape takes the first sample of each name, labels included, and says
// which name is missing.
func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# HELP x_total things\nx_total 7\nq{api=\"http\"} 3\nq{api=\"grpc\"} 4\nx_total 9\n")
	}))
	defer srv.Close()
	ctx := context.Background()
	m, err := Scrape(ctx, srv.URL, "x_total", `q{api="grpc"}`)
	if err != nil || m["x_total"] != 7 || m[`q{api="grpc"}`] != 4 {
		t.Fatalf("Scrape = %v, %v; want x_total 7, q{api=\"grpc\"} 4", m, err)
	}
	if _, err := Scrape(ctx, srv.URL, "absent"); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Errorf("Scrape of a missing metric: %v, want an error naming it", err)
	}
}

func TestBaselineNote(t *testing.T) {
	got := BaselineNote("the p99", 20, 16, 24)
	want := "baseline: the p99 is the median of both control phases of every rep, 20ms; the median of each rep's lower one would be 16ms, a ratio of 1.5"
	if got != want {
		t.Errorf("BaselineNote =\n%s\nwant\n%s", got, want)
	}
}

// StartGCCount reports each server's cycles since it started, by role,
// and nothing when a server does not export the count.
func TestStartGCCount(t *testing.T) {
	var cycles atomic.Int64
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "go_gc_duration_seconds_sum 0.5\ngo_gc_duration_seconds_count %d\n", cycles.Load())
	}))
	defer counting.Close()
	idle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "go_gc_duration_seconds_count 4\n")
	}))
	defer idle.Close()
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "heap_alloc 1\n")
	}))
	defer silent.Close()
	ctx := context.Background()

	cycles.Store(3)
	since := StartGCCount(ctx, []string{counting.URL, idle.URL}, []string{"leader", "f1"})
	cycles.Store(5)
	if got := since(); got != "leader=2,f1=0" {
		t.Fatalf("got %q, want leader=2,f1=0", got)
	}
	if got := StartGCCount(ctx, []string{counting.URL, silent.URL}, []string{"leader", "f1"})(); got != "" {
		t.Fatalf("with a server that has no count: got %q, want nothing", got)
	}
}

// TestStartGCCPU: the GC CPU reported is each server's rise in
// milliseconds, rounded.
func TestStartGCCPU(t *testing.T) {
	var ms atomic.Int64
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "go_cpu_classes_gc_total_cpu_seconds_total %g\n", float64(ms.Load())/1000)
	}))
	defer server.Close()
	ms.Store(1250)
	since := StartGCCPU(context.Background(), []string{server.URL}, []string{"leader"})
	ms.Store(1286)
	if got := since(); got != "leader=36" {
		t.Fatalf("got %q, want leader=36", got)
	}
}

// TestStartSlowLogWrites: the writes counted are those over the 12.8 ms
// bucket, per server, since the start.
func TestStartSlowLogWrites(t *testing.T) {
	var total, fast atomic.Int64
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "lodestone_log_write_latency_seconds_bucket{le=\"0.0064\"} %d\n", fast.Load()-1)
		fmt.Fprintf(w, "lodestone_log_write_latency_seconds_bucket{le=\"0.0128\"} %d\n", fast.Load())
		fmt.Fprintf(w, "lodestone_log_write_latency_seconds_count %d\n", total.Load())
	}))
	defer server.Close()
	ctx := context.Background()

	total.Store(100)
	fast.Store(98) // two slow writes before the start
	since := StartSlowLogWrites(ctx, []string{server.URL}, []string{"leader"})
	total.Store(200)
	fast.Store(195)
	if got := since(); got != "leader=3" {
		t.Fatalf("got %q, want leader=3", got)
	}
}

// TestCollectAll: every server is asked for a heap profile after a forced
// GC, in turn; one that refuses fails it, naming the request.
func TestCollectAll(t *testing.T) {
	var mu sync.Mutex // NB: the handlers run on the servers' goroutines
	var asked []string
	serve := func(ok bool) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			asked = append(asked, r.URL.String())
			mu.Unlock()
			if !ok {
				http.NotFound(w, r)
				return
			}
			fmt.Fprint(w, "profile")
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	a, b := serve(true), serve(true)
	if err := CollectAll(context.Background(), []string{a.URL, b.URL}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := slices.Clone(asked)
	mu.Unlock()
	if want := []string{"/debug/pprof/heap?gc=1", "/debug/pprof/heap?gc=1"}; !slices.Equal(got, want) {
		t.Fatalf("asked %q, want %q", got, want)
	}
	off := serve(false)
	err := CollectAll(context.Background(), []string{off.URL})
	if err == nil || !strings.Contains(err.Error(), "/debug/pprof/heap?gc=1") || !strings.Contains(err.Error(), "404") {
		t.Fatalf("a server without the profiler: %v, want an error naming the request and its status", err)
	}
}
