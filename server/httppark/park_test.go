package httppark_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/server/httppark"
	"github.com/lodestone-kv/lodestone/watch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rig is a real http.Server on loopback whose GET /wait parks until the
// key "k" changes (changed is set and an event published) or ?ms elapses.
type rig struct {
	hub     *watch.Hub
	lot     *httppark.Lot
	srv     *http.Server
	addr    string
	changed atomic.Bool
	index   atomic.Uint64
	done    atomic.Int64  // Wait.Done calls
	parkedC chan struct{} // BenchmarkParkCycle's handler parked
}

func newRig(t testing.TB, sweep time.Duration) *rig {
	return newRigWith(t, httppark.Config{SweepInterval: sweep, NextRequestWait: 5 * time.Second})
}

func newRigWith(t testing.TB, cfg httppark.Config) *rig {
	t.Helper()
	hub, err := watch.New(watch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{hub: hub, parkedC: make(chan struct{}, 1)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /wait", r.wait)
	mux.HandleFunc("GET /cycle", r.cycle)
	mux.HandleFunc("GET /panic", func(w http.ResponseWriter, req *http.Request) {
		if httppark.WaitOver(req.Context()) {
			panic("resumed handler fails")
		}
		r.wait(w, req)
	})
	mux.HandleFunc("GET /headers", func(w http.ResponseWriter, req *http.Request) {
		if httppark.WaitOver(req.Context()) {
			fmt.Fprintf(w, "keep=%q drop=%q query=%q remote=%v", req.Header.Get("X-Keep"), req.Header.Get("X-Drop"),
				req.URL.Query().Get("q"), req.RemoteAddr != "")
			return
		}
		r.wait(w, req)
	})
	mux.HandleFunc("GET /own", func(w http.ResponseWriter, req *http.Request) {
		if httppark.WaitOver(req.Context()) {
			fmt.Fprint(w, "resumed through the mux")
			return
		}
		ok, err := r.lot.Park(w, req, httppark.Wait{Watch: watch.Request{Key: "k", StartIndex: r.index.Load()},
			Changed: r.changed.Load, Deadline: time.Now().Add(time.Minute),
			Resume: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				at, _ := httppark.ParkedAt(req.Context())
				fmt.Fprintf(w, "resumed by the wait's handler, wait over: %v, parked at %d", httppark.WaitOver(req.Context()), at.UnixNano())
			})})
		if err != nil || !ok {
			http.Error(w, fmt.Sprint("not parked: ", err), http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("PUT /put", func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		fmt.Fprintf(w, "put %s", body)
	})
	cfg.Hub, cfg.Handler, cfg.Resume = hub, mux, mux
	r.lot = httppark.New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.srv = &http.Server{Handler: mux}
	served := make(chan error, 1)
	// NB: wrapped, as a connection limit wraps them, so the sweep must see
	// through to the socket.
	go func() { served <- r.srv.Serve(r.lot.Wrap(wrappingListener{ln})) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		// NB: a test that closed the Lot first closed the listener under Serve.
		if err := <-served; err != http.ErrServerClosed && !errors.Is(err, net.ErrClosed) {
			t.Errorf("serve: %v", err)
		}
		if err := r.lot.Close(); err != nil {
			t.Errorf("close lot: %v", err)
		}
		if err := hub.Close(); err != nil {
			t.Errorf("close hub: %v", err)
		}
	})
	return r
}

func (r *rig) wait(w http.ResponseWriter, req *http.Request) {
	_, force := req.URL.Query()["force"] // park even if changed: the hub replays what came after start
	if httppark.WaitOver(req.Context()) || (r.changed.Load() && !force) {
		fmt.Fprintf(w, "changed=%v", r.changed.Load())
		return
	}
	ms := 10_000
	fmt.Sscan(req.URL.Query().Get("ms"), &ms)
	start := r.index.Load()
	fmt.Sscan(req.URL.Query().Get("start"), &start)
	ok, err := r.lot.Park(w, req, httppark.Wait{
		Watch:    watch.Request{Key: "k", StartIndex: start},
		Changed:  r.changed.Load,
		Deadline: time.Now().Add(time.Duration(ms) * time.Millisecond),
		Done:     func() { r.done.Add(1) },
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if !ok {
		http.Error(w, "not parked", http.StatusTeapot)
	}
}

// publish puts key at the next index; with change, Changed reports true
// from then on (set before the event, as the store is applied before
// the hub hears of it).
func (r *rig) publish(key string, change bool) {
	if change {
		r.changed.Store(true)
	}
	i := r.index.Add(1)
	r.hub.Publish(i, []watch.Event{{Type: watch.Put, KV: watch.KeyValue{Key: key, ModifyIndex: i}}})
}

// eventually polls cond for up to 5s: parking and answering happen on
// other goroutines, so the tests wait for the state they then assert.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

type result struct {
	body string
	err  error
}

func get(client *http.Client, url string) <-chan result {
	out := make(chan result, 1)
	go func() {
		resp, err := client.Get(url)
		if err != nil {
			out <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %s: %s", resp.Status, b)
		}
		out <- result{body: string(b), err: err}
	}()
	return out
}

func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// conn is one client connection that sends its requests itself, so the
// tests know which connection each one used (a Transport may dial anew
// while the last one is on its way back to its pool).
type conn struct {
	c  net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, addr string) *conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &conn{c: c, br: bufio.NewReader(c)}
}

// send writes a GET of path.
func (c *conn) send(t *testing.T, path string) {
	t.Helper()
	c.write(t, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
}

// write sends raw bytes.
func (c *conn) write(t *testing.T, raw string) {
	t.Helper()
	if _, err := io.WriteString(c.c, raw); err != nil {
		t.Fatal(err)
	}
}

// answer reads one response and returns its body.
func (c *conn) answer(t *testing.T) string {
	t.Helper()
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("response %s %q: %v", resp.Status, b, err)
	}
	return string(b)
}

func TestParkedRequestAnswersOnChangeAndKeepsItsConnection(t *testing.T) {
	r := newRig(t, time.Hour)
	c := dial(t, r.addr)
	c.send(t, "/wait")
	eventually(t, "the request to park", func() bool { return r.lot.Len() == 1 })

	// An event that Changed does not confirm wakes the request, which
	// goes back to waiting.
	r.publish("k", false)
	eventually(t, "the wake-up", func() bool { return r.lot.Stats().Wakeups == 1 })
	if n := r.lot.Len(); n != 1 {
		t.Fatalf("after an unconfirmed event: %d parked, want 1", n)
	}

	r.publish("k", true)
	if body := c.answer(t); body != "changed=true" {
		t.Fatalf("answer %q, want changed=true", body)
	}
	if r.lot.Len() != 0 || r.done.Load() != 1 {
		t.Fatalf("after the answer: %d parked, %d Done calls; want 0 and 1", r.lot.Len(), r.done.Load())
	}
	// The Lot reads the connection's next request itself.
	c.send(t, "/wait")
	if body := c.answer(t); body != "changed=true" {
		t.Fatalf("next answer %q, want changed=true", body)
	}
	if st := r.lot.Stats(); st.Served != 1 || st.HandedBack != 0 {
		t.Fatalf("after the next request: %+v, want it served by the Lot", st)
	}
}

// TestIdleWorkerResumesTheNextRequest: a worker that answered waits for
// the next resumed request instead of ending.
func TestIdleWorkerResumesTheNextRequest(t *testing.T) {
	r := newRig(t, time.Hour)
	for i := range 3 {
		c := dial(t, r.addr)
		c.write(t, "GET /wait?ms=10 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		if got := c.answer(t); got != "changed=false" {
			t.Fatalf("request %d: answer %q, want the deadline's", i, got)
		}
		// NB: the worker goes idle just after it writes the answer.
		eventually(t, "an idle worker", func() bool { return r.lot.Stats().IdleWorkers == 1 })
	}
	if s := r.lot.Stats(); s.Resumed != 3 || s.Workers != 1 {
		t.Fatalf("stats %+v: want 3 requests resumed by 1 worker", s)
	}
}

// TestResumedRequestKeepsOnlyTheNamedHeaders: a parked request holds the
// headers Config.ResumeHeaders names, whatever their case, and drops the
// rest; the URL and the remote address stay.
func TestResumedRequestKeepsOnlyTheNamedHeaders(t *testing.T) {
	r := newRigWith(t, httppark.Config{SweepInterval: time.Hour, ResumeHeaders: []string{"x-keep"}})
	c := dial(t, r.addr)
	c.write(t, "GET /headers?q=v HTTP/1.1\r\nHost: x\r\nX-Keep: yes\r\nX-Drop: no\r\n\r\n")
	eventually(t, "the request to park", func() bool { return r.lot.Len() == 1 })
	r.publish("k", true)
	want := `keep="yes" drop="" query="v" remote=true`
	if body := c.answer(t); body != want {
		t.Fatalf("resumed handler saw %s, want %s", body, want)
	}
}

// TestQuietConnectionGoesBackToTheServer: a client that sends nothing
// for NextRequestWait after an answer is served by the http.Server from
// then on, on the same connection.
func TestQuietConnectionGoesBackToTheServer(t *testing.T) {
	r := newRigWith(t, httppark.Config{SweepInterval: time.Hour, NextRequestWait: 20 * time.Millisecond})
	c := dial(t, r.addr)
	c.send(t, "/wait")
	eventually(t, "the request to park", func() bool { return r.lot.Len() == 1 })
	r.publish("k", true)
	c.answer(t)
	eventually(t, "the hand-back", func() bool { return r.lot.Stats().HandedBack == 1 })
	c.send(t, "/wait")
	if body := c.answer(t); body != "changed=true" {
		t.Fatalf("next answer %q, want changed=true", body)
	}
	if st := r.lot.Stats(); st.Served != 0 {
		t.Fatalf("%+v: the Lot served a request after handing its connection back", st)
	}
}

// Wait.Resume, when set, serves the resumed request instead of
// Config.Resume.
func TestResumeGoesToTheWaitsHandler(t *testing.T) {
	r := newRigWith(t, httppark.Config{SweepInterval: time.Hour})
	c := dial(t, r.addr)
	sent := time.Now()
	c.send(t, "/own")
	eventually(t, "the request to park", func() bool { return r.lot.Len() == 1 })
	parked := time.Now()
	r.publish("k", true)
	body := c.answer(t)
	var at int64
	if _, err := fmt.Sscanf(body, "resumed by the wait's handler, wait over: true, parked at %d", &at); err != nil {
		t.Fatalf("answer %q, want the wait's own handler's: %v", body, err)
	}
	// ParkedAt is when its read began, for the consistency the answer owes.
	if at < sent.UnixNano() || at > parked.UnixNano() {
		t.Errorf("ParkedAt %v, want between the request's sending (%v) and the Lot holding it (%v)",
			time.Unix(0, at), sent, parked)
	}
}

// An answer's write deadline does not outlive the Lot's hold on the
// connection: the http.Server, which sets none of its own, writes on it
// long after.
func TestHandedBackConnectionKeepsNoWriteDeadline(t *testing.T) {
	const writeTimeout = 50 * time.Millisecond
	r := newRigWith(t, httppark.Config{SweepInterval: time.Hour, NextRequestWait: 20 * time.Millisecond, WriteTimeout: writeTimeout})
	c := dial(t, r.addr)
	c.send(t, "/wait")
	eventually(t, "the request to park", func() bool { return r.lot.Len() == 1 })
	r.publish("k", true)
	c.answer(t)
	answered := time.Now()
	eventually(t, "the hand-back", func() bool { return r.lot.Stats().HandedBack == 1 })
	// NB: waits for a point in time, the answer's deadline, not for a
	// state: the deadline must be over before the server writes.
	time.Sleep(time.Until(answered.Add(2 * writeTimeout)))
	c.write(t, "PUT /put HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx")
	if body := c.answer(t); body != "put x" {
		t.Fatalf("answer from the http.Server %q, want put x", body)
	}
}

func TestParkedRequestAnswersAtItsDeadline(t *testing.T) {
	r := newRig(t, time.Hour)
	start := time.Now()
	res := <-get(newClient(t), "http://"+r.addr+"/wait?ms=100")
	if res.err != nil || res.body != "changed=false" {
		t.Fatalf("answer: %+v, want changed=false", res)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("answered after %v, before the 100ms deadline", d)
	}
	if r.done.Load() != 1 {
		t.Fatalf("Done called %d times, want 1", r.done.Load())
	}
}

// TestDeadlinesAnswerInOrder: one alarm serves every parked request's
// deadline. A request parked after a later one, with an earlier deadline,
// is still answered at its own; each is answered at or after its
// deadline, and the long one is still parked meanwhile.
func TestDeadlinesAnswerInOrder(t *testing.T) {
	r := newRig(t, time.Hour)
	start := time.Now()
	long := get(newClient(t), "http://"+r.addr+"/wait?ms=1500")
	eventually(t, "the long request parked", func() bool { return r.lot.Len() == 1 })
	mid := get(newClient(t), "http://"+r.addr+"/wait?ms=300")
	short := get(newClient(t), "http://"+r.addr+"/wait?ms=100")
	var order []string
	var at []time.Duration
	for range 2 {
		select {
		case res := <-short:
			order, at = append(order, "short"), append(at, time.Since(start))
			if res.err != nil || res.body != "changed=false" {
				t.Fatalf("short: %+v", res)
			}
		case res := <-mid:
			order, at = append(order, "mid"), append(at, time.Since(start))
			if res.err != nil || res.body != "changed=false" {
				t.Fatalf("mid: %+v", res)
			}
		}
	}
	if order[0] != "short" || at[0] < 100*time.Millisecond || at[1] < 300*time.Millisecond {
		t.Fatalf("answered %v at %v: want short (100ms), then mid (300ms), none early", order, at)
	}
	if at[1] >= 1500*time.Millisecond || r.lot.Len() != 1 {
		t.Fatalf("the 100ms and 300ms requests waited until %v (parked now: %d): the alarm stayed on the 1.5s deadline", at[1], r.lot.Len())
	}
	if res := <-long; res.err != nil || res.body != "changed=false" || time.Since(start) < 1500*time.Millisecond {
		t.Fatalf("long: %+v after %v, want changed=false at 1.5s or later", res, time.Since(start))
	}
}

// TestParkedClientGoneIsSwept: a client that hangs up while parked is
// freed by the sweep, without waiting for its deadline.
func TestParkedClientGoneIsSwept(t *testing.T) {
	r := newRig(t, 20*time.Millisecond)
	c := dial(t, r.addr)
	c.send(t, "/wait")
	eventually(t, "the request to park", func() bool { return r.lot.Len() == 1 })
	c.c.Close()
	// NB: the sweep counts a request gone just after it leaves the Lot.
	eventually(t, "the sweep to free it", func() bool { return r.lot.Stats().Gone == 1 })
	if st := r.lot.Stats(); st.Parked != 0 || st.Gone != 1 || st.Resumed != 0 || r.done.Load() != 1 {
		t.Fatalf("after the hang-up: %+v, %d Done calls; want 1 gone, none resumed, 1 Done", st, r.done.Load())
	}
}

// TestPipelinedRequestFollowsTheParkedOne: what the client sent after the
// parked request is served, in order, once it is answered.
func TestPipelinedRequestFollowsTheParkedOne(t *testing.T) {
	r := newRig(t, 20*time.Millisecond)
	c := dial(t, r.addr)
	c.write(t, "GET /wait HTTP/1.1\r\nHost: x\r\n\r\n"+
		"PUT /put HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
	eventually(t, "the request to park", func() bool { return r.lot.Len() == 1 })
	sweeps := r.lot.Stats().Sweeps
	eventually(t, "two more sweeps", func() bool { return r.lot.Stats().Sweeps >= sweeps+2 })
	if r.lot.Len() != 1 {
		t.Fatal("a sweep took pipelined data for a closed connection")
	}
	r.publish("k", true)
	for _, want := range []string{"changed=true", "put hello"} {
		if body := c.answer(t); body != want {
			t.Fatalf("response %q, want %q", body, want)
		}
	}
}

func TestParkRefusesWhatItCannotReplay(t *testing.T) {
	r := newRig(t, time.Hour)
	for _, tc := range []struct{ method, body, proto string }{
		{http.MethodPost, "x", "HTTP/1.1"},
		{http.MethodGet, "x", "HTTP/1.1"}, // a GET with a body
	} {
		req, _ := http.NewRequest(tc.method, "http://"+r.addr+"/wait", strings.NewReader(tc.body))
		if r.lot.Parkable(req) {
			t.Errorf("%s with a %d-byte body: parkable", tc.method, len(tc.body))
		}
	}
	h2 := &http.Request{Method: http.MethodGet, ProtoMajor: 2}
	if r.lot.Parkable(h2) {
		t.Error("an HTTP/2 request: parkable")
	}
	var none *httppark.Lot
	if none.Parkable(&http.Request{Method: http.MethodGet, ProtoMajor: 1}) {
		t.Error("a nil Lot: parkable")
	}
}

// TestCloseEndsParkedRequests: Close hangs up on parked clients, calls
// their Done, and leaves no goroutine (TestMain checks).
func TestCloseEndsParkedRequests(t *testing.T) {
	r := newRig(t, time.Hour)
	res := get(newClient(t), "http://"+r.addr+"/wait")
	eventually(t, "the request to park", func() bool { return r.lot.Len() == 1 })
	if err := r.lot.Close(); err != nil {
		t.Fatal(err)
	}
	if got := <-res; got.err == nil {
		t.Fatalf("parked request answered %q after Close, want a hang-up", got.body)
	}
	if r.done.Load() != 1 {
		t.Fatalf("Done called %d times, want 1", r.done.Load())
	}
}

// TestLotReadsAHeadSentInPieces: the Lot's own read of a connection's
// next request waits for the whole head, however the client splits it.
func TestLotReadsAHeadSentInPieces(t *testing.T) {
	r := newRig(t, time.Hour)
	c := dial(t, r.addr)
	c.send(t, "/wait")
	eventually(t, "the request to park", func() bool { return r.lot.Len() == 1 })
	r.publish("k", true)
	for i, pieces := range [][]string{nil, {"GET /wait HTTP/1.1\r\nHo", "st: x\r", "\n\r\n"}} {
		for _, p := range pieces {
			c.write(t, p)
			time.Sleep(5 * time.Millisecond) // NB: separate segments, not a guess at timing: any split must work
		}
		if body := c.answer(t); body != "changed=true" {
			t.Fatalf("response %d: %q", i, body)
		}
	}
	if st := r.lot.Stats(); st.Served != 1 {
		t.Fatalf("%+v: want the second request served by the Lot", st)
	}
}

// TestEventBeforeParkingWakes: an event the hub replays as the watcher
// starts (after the request's index, before the Lot registered the
// request) answers it at once, not at its deadline.
func TestEventBeforeParkingWakes(t *testing.T) {
	r := newRig(t, time.Hour)
	r.publish("k", true)
	start := time.Now()
	res := <-get(newClient(t), "http://"+r.addr+"/wait?force&start=0&ms=30000")
	if res.err != nil || res.body != "changed=true" {
		t.Fatalf("answer: %+v", res)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("answered after %v: the replayed event was missed until the deadline", d)
	}
}

type wrappingListener struct{ net.Listener }

func (l wrappingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return wrappedConn{c}, nil
}

type wrappedConn struct{ net.Conn }

func (c wrappedConn) NetConn() net.Conn { return c.Conn }

// TestResumedHandlerPanicCostsItsConnection: a handler that panics when
// the Lot resumes it loses its connection, as under net/http; the server
// goes on.
func TestResumedHandlerPanicCostsItsConnection(t *testing.T) {
	r := newRig(t, time.Hour)
	if res := <-get(newClient(t), "http://"+r.addr+"/panic?ms=10"); res.err == nil {
		t.Fatalf("a panicking handler answered %q", res.body)
	}
	r.publish("k", true)
	if res := <-get(newClient(t), "http://"+r.addr+"/wait"); res.err != nil || res.body != "changed=true" {
		t.Fatalf("after the panic: %+v", res)
	}
}

// TestLotHandsBackAGetWithABodyHeader: a GET that declares a body, in
// any letter case, goes to the http.Server, which serves it.
func TestLotHandsBackAGetWithABodyHeader(t *testing.T) {
	r := newRig(t, time.Hour)
	c := dial(t, r.addr)
	c.send(t, "/wait")
	eventually(t, "the request to park", func() bool { return r.lot.Len() == 1 })
	r.publish("k", true)
	c.answer(t)
	c.write(t, "GET /wait HTTP/1.1\r\nHost: x\r\ncONTENT-lENGTH: 0\r\n\r\n")
	if body := c.answer(t); body != "changed=true" {
		t.Fatalf("answer %q, want changed=true", body)
	}
	// NB: the lot counts a hand-back after the server took the connection.
	eventually(t, "the hand-back count", func() bool { return r.lot.Stats().HandedBack == 1 })
	if st := r.lot.Stats(); st.Served != 0 {
		t.Fatalf("%+v: want the request handed back, not served by the lot", st)
	}
}

// TestPipelinedClientGoneIsSwept: a request the lot parked from a
// connection it had held pipelined bytes of (so the connection is wrapped)
// is still freed when its client hangs up.
func TestPipelinedClientGoneIsSwept(t *testing.T) {
	r := newRig(t, 20*time.Millisecond)
	c := dial(t, r.addr)
	// The second request parks whatever Changed says, from index 1: the
	// index the first one's answer comes at.
	c.write(t, "GET /wait HTTP/1.1\r\nHost: x\r\n\r\nGET /wait?force&start=1 HTTP/1.1\r\nHost: x\r\n\r\n")
	eventually(t, "the first request to park", func() bool { return r.lot.Len() == 1 })
	r.publish("k", true)
	if body := c.answer(t); body != "changed=true" {
		t.Fatalf("first answer %q", body)
	}
	eventually(t, "the second request to park", func() bool { st := r.lot.Stats(); return st.Served == 1 && st.Parked == 1 })
	c.c.Close()
	eventually(t, "the sweep to free it", func() bool { return r.lot.Stats().Gone == 1 })
	if st := r.lot.Stats(); st.Parked != 0 || st.Gone != 1 || st.Resumed != 1 {
		t.Fatalf("%+v: want the second request gone, only the first resumed", st)
	}
}
