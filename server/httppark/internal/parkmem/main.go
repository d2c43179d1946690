// Command parkmem measures what parked Consul blocking queries cost one
// lodestone server process in memory and CPU. It starts a one-member
// server from -bin, puts -rate writes/s through the Consul KV API for a
// window with no queries, then opens -queries blocking queries on
// distinct keys (one connection each, re-issued after every answer as
// consul-template does) and puts the same writes to their keys for a
// second window. For each phase it reports the server's resident set
// (peak while writing, and after a forced GC), its live heap after that
// GC, its CPU time, and the answers; the differences per parked query and
// the CPU per answer ("wake") follow. Heap profiles after each phase go to
// -out.
//
//	go build -o /tmp/lodestone ./cmd/lodestone
//	go run ./server/httppark/internal/parkmem -bin /tmp/lodestone -queries 10000
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

var (
	flagBin     = flag.String("bin", "", "lodestone binary (required)")
	flagQueries = flag.Int("queries", 10000, "parked blocking queries, one per key and connection")
	flagRate    = flag.Int("rate", 1000, "writes per second, to the queries' keys round-robin")
	flagWindow  = flag.Duration("window", 20*time.Second, "measured window of each phase")
	flagWait    = flag.Duration("wait", 5*time.Minute, "?wait of every query")
	flagOut     = flag.String("out", "", "directory for heap profiles (none if empty)")
	flagCPUs    = flag.String("server-cpus", "", "taskset CPU list for the server (empty: no pinning)")
	flagArgs    = flag.String("server-args", "", "more server flags, space separated (e.g. --gc-heap-floor-mib 64)")
	flagEnv     = flag.String("server-env", "", "more server environment, space separated (e.g. GOMEMLIMIT=256MiB)")
)

func main() {
	flag.Parse()
	if err := run(context.Background()); err != nil {
		slog.Error("parkmem", "err", err)
		os.Exit(1)
	}
}

// phase is what one window measured.
type phase struct {
	name             string
	peakRSS, gcRSS   int64 // bytes
	heapLive, heapIn int64 // after the forced GC: HeapAlloc, HeapInuse
	stacks           int64
	goroutines       int64
	cpu              time.Duration // server utime+stime over the window
	gcs, allocated   float64       // GC cycles and bytes allocated over the window
	gcCPU            float64       // seconds of CPU the runtime counts as GC over the window
	answers          int64
	writes           []time.Duration
}

func run(ctx context.Context) error {
	if *flagBin == "" {
		return errors.New("-bin is required")
	}
	dir, err := os.MkdirTemp("", "parkmem-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := start(ctx, dir)
	if err != nil {
		return err
	}
	defer srv.stop()

	w := &writer{base: srv.http, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	none, err := measure(srv, "none", w, nil)
	if err != nil {
		return err
	}
	q := &queries{base: srv.http, n: *flagQueries}
	if err := q.open(); err != nil {
		return err
	}
	defer q.close()
	if err := srv.waitParked(*flagQueries, time.Minute); err != nil {
		return err
	}
	with, err := measure(srv, "parked", w, q)
	if err != nil {
		return err
	}
	report(none, with, q)
	return nil
}

// measure runs one window of writes and reads the server's figures.
func measure(srv *server, name string, w *writer, q *queries) (phase, error) {
	p := phase{name: name}
	var answers0 int64
	if q != nil {
		answers0 = q.answers.Load()
	}
	cpu0, err := procCPU(srv.pid)
	if err != nil {
		return p, err
	}
	m0, err := metrics(srv.http)
	if err != nil {
		return p, err
	}
	stop := make(chan struct{})
	var peak atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			if rss, err := procRSS(srv.pid); err == nil && rss > peak.Load() {
				peak.Store(rss)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})
	p.writes = w.run(*flagRate, *flagWindow, *flagQueries)
	close(stop)
	wg.Wait()
	cpu1, err := procCPU(srv.pid)
	if err != nil {
		return p, err
	}
	p.cpu = cpu1 - cpu0
	m1, err := metrics(srv.http)
	if err != nil {
		return p, err
	}
	p.gcs = m1["go_gc_duration_seconds_count"] - m0["go_gc_duration_seconds_count"]
	p.allocated = m1["go_memstats_alloc_bytes_total"] - m0["go_memstats_alloc_bytes_total"]
	p.gcCPU = m1["go_cpu_classes_gc_total_cpu_seconds_total"] - m0["go_cpu_classes_gc_total_cpu_seconds_total"]
	if q != nil {
		p.answers = q.answers.Load() - answers0
	}
	p.peakRSS = peak.Load()
	// A forced GC, as /debug/pprof/heap?gc=1 does; the profile is kept.
	prof, err := get(srv.http + "/debug/pprof/heap?gc=1")
	if err != nil {
		return p, err
	}
	if *flagOut != "" {
		if err := os.WriteFile(filepath.Join(*flagOut, name+".heap.pprof"), prof, 0o644); err != nil {
			return p, err
		}
	}
	time.Sleep(time.Second) // NB: the metrics below are read after the cycle
	m, err := metrics(srv.http)
	if err != nil {
		return p, err
	}
	p.heapLive, p.heapIn = int64(m["go_memstats_heap_alloc_bytes"]), int64(m["go_memstats_heap_inuse_bytes"])
	p.stacks, p.goroutines = int64(m["go_memstats_stack_inuse_bytes"]), int64(m["go_goroutines"])
	if p.gcRSS, err = procRSS(srv.pid); err != nil {
		return p, err
	}
	return p, nil
}

func report(none, with phase, q *queries) {
	n := float64(*flagQueries)
	mib := func(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
	per := func(a, b int64) string { return fmt.Sprintf("%.0f B", float64(b-a)/n) }
	fmt.Printf("server: %s %s; %d queries, %d writes/s, %v windows\n", *flagArgs, *flagEnv, *flagQueries, *flagRate, *flagWindow)
	for _, p := range []phase{none, with} {
		fmt.Printf("%-7s rss peak %s, after GC %s; heap live %s, in use %s; stacks %s in %d goroutines; cpu %v; %.0f GC cycles (%.0f ms CPU), %.1f MiB allocated; answers %d; write p50 %v p99 %v (%d writes)\n",
			p.name, mib(p.peakRSS), mib(p.gcRSS), mib(p.heapLive), mib(p.heapIn), mib(p.stacks), p.goroutines, p.cpu.Round(time.Millisecond),
			p.gcs, p.gcCPU*1000, p.allocated/(1<<20), p.answers, pct(p.writes, 0.50), pct(p.writes, 0.99), len(p.writes))
	}
	fmt.Printf("per parked query: rss after GC %s, peak rss %s, heap live %s, heap in use %s, stacks %s\n",
		per(none.gcRSS, with.gcRSS), per(none.peakRSS, with.peakRSS), per(none.heapLive, with.heapLive), per(none.heapIn, with.heapIn), per(none.stacks, with.stacks))
	if with.answers > 0 {
		a := float64(with.answers)
		fmt.Printf("per answer: cpu %v all, %v beyond the no-query window's; allocated %.0f B beyond it\n",
			(with.cpu / time.Duration(with.answers)).Round(100*time.Nanosecond), ((with.cpu - none.cpu) / time.Duration(with.answers)).Round(100*time.Nanosecond),
			(with.allocated-none.allocated)/a)
	}
	fmt.Printf("queries: %d answered in all, %d errors\n", q.answers.Load(), q.errors.Load())
}

func pct(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))].Round(10 * time.Microsecond)
}

// server is the lodestone process under measurement.
type server struct {
	cmd  *exec.Cmd
	pid  int
	http string
}

func start(ctx context.Context, dir string) (*server, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	args := []string{"server", "--name", "m1", "--data-dir", filepath.Join(dir, "m1"),
		"--listen-peer", ports[0], "--listen-grpc", ports[1], "--listen-http", ports[2],
		"--log-level", "warn", "--enable-pprof", "--max-http-connections-per-client", "-1",
		"--max-http-connections", strconv.Itoa(*flagQueries + 1000)}
	args = append(args, strings.Fields(*flagArgs)...)
	name := *flagBin
	if *flagCPUs != "" {
		args = append([]string{"-c", *flagCPUs, name}, args...)
		name = "taskset"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), strings.Fields(*flagEnv)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, pid: cmd.Process.Pid, http: "http://" + ports[2]}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.http + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("server not ready after 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *server) stop() {
	s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
}

func (s *server) waitParked(n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		m, err := metrics(s.http)
		if err != nil {
			return err
		}
		if int(m["lodestone_http_parked_requests"]) >= n || int(m[`lodestone_blocking_queries_in_flight{api="http"}`]) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%v of %d queries parked after %v", m["lodestone_http_parked_requests"], n, limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// writer puts values to the queries' keys at a fixed rate, open loop.
type writer struct {
	base   string
	client *http.Client
	seq    int
}

func (w *writer) run(rate int, window time.Duration, nkeys int) []time.Duration {
	gap := time.Second / time.Duration(rate)
	total := int(window / gap)
	lat := make([]time.Duration, total)
	var wg sync.WaitGroup
	begin := time.Now()
	for i := range total {
		due := begin.Add(time.Duration(i) * gap)
		time.Sleep(time.Until(due))
		key := w.seq % nkeys
		w.seq++
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/v1/kv/park/%d", w.base, key), strings.NewReader(strconv.Itoa(i)))
			resp, err := w.client.Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			lat[i] = time.Since(due)
		})
	}
	wg.Wait()
	return lat
}

// queries are the blocking queries, one goroutine and connection each.
type queries struct {
	base            string
	n               int
	conns           []net.Conn
	answers, errors atomic.Int64
	wg              sync.WaitGroup
}

func (q *queries) open() error {
	index, err := q.index()
	if err != nil {
		return err
	}
	host := strings.TrimPrefix(q.base, "http://")
	for i := range q.n {
		c, err := net.Dial("tcp", host)
		if err != nil {
			return fmt.Errorf("query %d: %w", i, err)
		}
		q.conns = append(q.conns, c)
		q.wg.Go(func() { q.loop(c, i, index) })
	}
	return nil
}

func (q *queries) index() (string, error) {
	resp, err := http.Get(q.base + "/v1/kv/park/none")
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	return resp.Header.Get("X-Consul-Index"), nil
}

// loop asks for key i after index, and again after each answer.
func (q *queries) loop(c net.Conn, i int, index string) {
	br := bufio.NewReader(c)
	for {
		// NB: the headers the official Consul Go client sends.
		if _, err := fmt.Fprintf(c, "GET /v1/kv/park/%d?index=%s&wait=%dms HTTP/1.1\r\nHost: x\r\nUser-Agent: Go-http-client/1.1\r\nAccept-Encoding: gzip\r\n\r\n",
			i, index, flagWait.Milliseconds()); err != nil {
			return
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				q.errors.Add(1)
			}
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNotFound {
			q.errors.Add(1)
		}
		q.answers.Add(1)
		if next := resp.Header.Get("X-Consul-Index"); next != "" {
			index = next
		}
	}
}

func (q *queries) close() {
	for _, c := range q.conns {
		c.Close()
	}
	q.wg.Wait()
}

func get(url string) ([]byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, err
}

// metrics reads the server's unlabelled (and a few labelled) samples.
func metrics(base string) (map[string]float64, error) {
	b, err := get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	m := make(map[string]float64)
	for line := range bytes.Lines(b) {
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		name, val, ok := strings.Cut(strings.TrimSpace(string(line)), " ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			m[name] = v
		}
	}
	return m, nil
}

// procRSS is the process's resident set in bytes (/proc/PID/statm).
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("statm: %q", b)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize()), err
}

// procCPU is the process's user and system time (/proc/PID/stat).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// NB: fields after the command name, which may hold spaces.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %q", b)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const hz = 100 // NB: USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / hz, nil
}

func freePorts(n int) ([]string, error) {
	var out []string
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}
