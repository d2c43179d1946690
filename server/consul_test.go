package server

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	dto "github.com/prometheus/client_model/go"
)

// consulClient returns the official Consul Go client pointed at a member,
// retrying "No cluster leader" answers (retryNoLeader).
func consulClient(t *testing.T, c *testCluster, name string) *consul.Client {
	t.Helper()
	return newConsulClient(t, c, name, "", func(tr http.RoundTripper) http.RoundTripper { return retryNoLeader{tr} })
}

// newConsulClient is the official client on member name sending secret,
// its transport wrapped by wrap (nil: every answer reaches the test).
func newConsulClient(t *testing.T, c *testCluster, name, secret string, wrap func(http.RoundTripper) http.RoundTripper) *consul.Client {
	t.Helper()
	cfg := consul.DefaultConfig()
	cfg.Address = c.servers[name].HTTPAddr()
	cfg.Token = secret
	// NB: a private transport, closed with the test, so no idle keep-alive
	// goroutine outlives it.
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	var rt http.RoundTripper = tr
	if wrap != nil {
		rt = wrap(tr)
	}
	cfg.HttpClient = &http.Client{Transport: rt}
	cl, err := consul.NewClient(cfg)
	if err != nil {
		t.Fatalf("consul client: %v", err)
	}
	return cl
}

// retryNoLeader retries a request the server answered with "No cluster
// leader" (gRPC Unavailable: proven not applied), as Consul's own tools do
// with a retry loop: on a loaded test machine a 200ms election timeout
// makes a read miss its ReadIndex deadline now and then. Any other answer,
// including an unknown write outcome, goes to the test as is.
type retryNoLeader struct{ next http.RoundTripper }

func (r retryNoLeader) RoundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		if attempt > 0 && req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			req.Body = body
		}
		resp, err := r.next.RoundTrip(req)
		rewindable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
		if err != nil || resp.StatusCode != http.StatusInternalServerError || attempt == 20 || !rewindable {
			return resp, err
		}
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr != nil {
			return nil, rerr
		}
		if !bytes.HasPrefix(b, []byte("No cluster leader")) {
			resp.Body = io.NopCloser(bytes.NewReader(b))
			return resp, nil
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
}

func TestConsulKVCRUDWithFlagsAndBinaryValues(t *testing.T) {
	c := newTestCluster(t, 3)
	kv := consulClient(t, c, c.follower()).KV()

	binary := []byte{0, 1, 2, 0xff, 0xfe, '\n'}
	if _, err := kv.Put(&consul.KVPair{Key: "app/bin", Value: binary, Flags: 42}, nil); err != nil {
		t.Fatalf("put: %v", err)
	}
	pair, meta, err := kv.Get("app/bin", nil)
	if err != nil || pair == nil {
		t.Fatalf("get: %v %v", pair, err)
	}
	if !bytes.Equal(pair.Value, binary) || pair.Flags != 42 {
		t.Fatalf("got value %v flags %d, want %v flags 42", pair.Value, pair.Flags, binary)
	}
	if meta.LastIndex == 0 || !meta.KnownLeader {
		t.Fatalf("query meta: index %d known leader %v", meta.LastIndex, meta.KnownLeader)
	}
	if missing, _, err := kv.Get("app/missing", nil); err != nil || missing != nil {
		t.Fatalf("get missing: %v %v, want nil nil", missing, err)
	}

	for _, k := range []string{"app/a", "app/dir/x", "app/dir/y", "other"} {
		if _, err := kv.Put(&consul.KVPair{Key: k, Value: []byte(k)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	list, _, err := kv.List("app/", nil)
	if err != nil || len(list) != 4 {
		t.Fatalf("list app/: %d entries, err %v; want 4", len(list), err)
	}
	keys, _, err := kv.Keys("app/", "/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(keys), "[app/a app/bin app/dir/]"; got != want {
		t.Fatalf("keys with separator: got %s, want %s", got, want)
	}
	if _, err := kv.DeleteTree("app/dir/", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Delete("app/a", nil); err != nil {
		t.Fatal(err)
	}
	keys, _, err = kv.Keys("app/", "", nil)
	if err != nil || fmt.Sprint(keys) != "[app/bin]" {
		t.Fatalf("keys after deletes: %v %v", keys, err)
	}
}

// N goroutines increment one counter by CAS; the final value equals the
// number of successful CASes.
func TestConsulCASCounter(t *testing.T) {
	c := newTestCluster(t, 3)
	var clients []*consul.KV
	for _, n := range c.names {
		clients = append(clients, consulClient(t, c, n).KV())
	}
	if _, err := clients[0].Put(&consul.KVPair{Key: "counter", Value: []byte("0")}, nil); err != nil {
		t.Fatal(err)
	}
	var wins atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		kv := clients[g%len(clients)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 15; i++ {
				pair, _, err := kv.Get("counter", nil)
				if err != nil || pair == nil {
					t.Errorf("get counter: %v", err)
					return
				}
				var n int
				fmt.Sscan(string(pair.Value), &n)
				ok, _, err := kv.CAS(&consul.KVPair{Key: "counter", Value: []byte(fmt.Sprint(n + 1)), ModifyIndex: pair.ModifyIndex}, nil)
				if err != nil {
					t.Errorf("cas: %v", err)
					return
				}
				if ok {
					wins.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	pair, _, err := clients[0].Get("counter", &consul.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(pair.Value), fmt.Sprint(wins.Load()); got != want {
		t.Fatalf("counter %s after %s successful CASes", got, want)
	}
	if wins.Load() == 0 {
		t.Fatal("no CAS succeeded")
	}
}

// A blocking query returns on change; without one it returns after the
// wait with the same index.
// TestConsulBlockingQuery runs each blocking query both ways a server can
// hold it: parked (server/httppark, the default) and on net/http's
// goroutines (NoParking).
func TestConsulBlockingQuery(t *testing.T) {
	for _, tc := range []struct {
		name      string
		noParking bool
	}{{"parked", false}, {"goroutines", true}} {
		t.Run(tc.name, func(t *testing.T) { testConsulBlockingQuery(t, tc.noParking) })
	}
}

func testConsulBlockingQuery(t *testing.T, noParking bool) {
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.NoParking = noParking })
	name := c.follower()
	s := c.servers[name]
	if (s.park == nil) != noParking {
		t.Fatalf("NoParking=%v, but the server's lot is %v", noParking, s.park)
	}
	kv := consulClient(t, c, name).KV()
	if _, err := kv.Put(&consul.KVPair{Key: "cfg", Value: []byte("v1")}, nil); err != nil {
		t.Fatal(err)
	}
	_, meta, err := kv.Get("cfg", nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, meta2, err := kv.Get("cfg", &consul.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("blocking query with no change returned after %v", took)
	}
	if meta2.LastIndex != meta.LastIndex {
		t.Fatalf("index after an idle wait: got %d, want %d", meta2.LastIndex, meta.LastIndex)
	}

	done := make(chan *consul.KVPair, 1)
	go func() {
		p, _, err := kv.Get("cfg", &consul.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 20 * time.Second})
		if err != nil {
			t.Errorf("blocking get: %v", err)
		}
		done <- p
	}()
	waitFor(t, 10*time.Second, func() bool {
		var m dto.Metric
		return s.sessionMetrics.blocking.WithLabelValues("http").Write(&m) == nil && m.GetGauge().GetValue() == 1
	})
	if !noParking && s.park.Stats().Parked != 1 {
		t.Fatalf("waiting query not parked: %+v", s.park.Stats())
	}
	if _, err := kv.Put(&consul.KVPair{Key: "cfg", Value: []byte("v2")}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-done:
		if p == nil || string(p.Value) != "v2" {
			t.Fatalf("blocking query woke with %v, want v2", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("blocking query did not wake on change")
	}
	if noParking {
		return
	}
	if st := s.park.Stats(); st.Resumed != 2 {
		t.Fatalf("%+v: want both blocking queries answered from the lot", st)
	}
}

func TestConsulTxnAllOrNothing(t *testing.T) {
	c := newTestCluster(t, 1)
	cl := consulClient(t, c, c.waitLeader())
	kv := cl.KV()
	if _, err := kv.Put(&consul.KVPair{Key: "exists", Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	ok, resp, _, err := kv.Txn(consul.KVTxnOps{
		{Verb: consul.KVSet, Key: "t/a", Value: []byte("1")},
		{Verb: consul.KVCheckNotExists, Key: "exists"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok || len(resp.Errors) != 1 || resp.Errors[0].OpIndex != 1 {
		t.Fatalf("failing txn: ok=%v errors=%+v", ok, resp.Errors)
	}
	if p, _, _ := kv.Get("t/a", nil); p != nil {
		t.Fatal("a failed transaction wrote t/a")
	}
	ok, resp, _, err = kv.Txn(consul.KVTxnOps{
		{Verb: consul.KVSet, Key: "t/a", Value: []byte("1")},
		{Verb: consul.KVSet, Key: "t/b", Value: []byte("2")},
		{Verb: consul.KVGet, Key: "exists"},
	}, nil)
	if err != nil || !ok {
		t.Fatalf("txn: ok=%v err=%v errors=%+v", ok, err, resp)
	}
	if got := string(resp.Results[2].Value); got != "x" {
		t.Fatalf("txn get: %q, want x", got)
	}
	leader, err := cl.Status().Leader()
	if err != nil || leader == "" {
		t.Fatalf("status leader: %q %v", leader, err)
	}
}

// Consul's default consistency mode reads the leader's committed state
// with no quorum round; ?consistent pays for one (ReadIndex). A follower
// in the default mode asks the leader for its commit index (one
// LeaderIndex call, no round) and reads once it has applied it. All of
// them see the acknowledged write.
func TestConsulDefaultModeReadsWithoutQuorumRound(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	fol := c.follower()
	leader, follower := consulClient(t, c, lead).KV(), consulClient(t, c, fol).KV()
	if _, err := follower.Put(&consul.KVPair{Key: "mode", Value: []byte("v1")}, nil); err != nil {
		t.Fatal(err)
	}
	const rounds, served = "lodestone_read_index_latency_seconds", "lodestone_leader_reads_total"
	read := func(kv *consul.KV, name string, q *consul.QueryOptions) (dRounds, dServed float64) {
		t.Helper()
		s := c.servers[name]
		r0, s0 := gauge(t, s, rounds), gauge(t, s, served)
		pair, _, err := kv.Get("mode", q)
		if err != nil || pair == nil || string(pair.Value) != "v1" {
			t.Fatalf("get on %s (%+v): %v, %v; want v1", name, q, pair, err)
		}
		return gauge(t, s, rounds) - r0, gauge(t, s, served) - s0
	}
	if r, s := read(leader, lead, nil); r != 0 || s != 1 {
		t.Errorf("default mode on the leader: %v ReadIndex rounds, %v leader reads; want 0, 1", r, s)
	}
	if r, s := read(leader, lead, &consul.QueryOptions{RequireConsistent: true}); r != 1 || s != 0 {
		t.Errorf("?consistent on the leader: %v ReadIndex rounds, %v leader reads; want 1, 0", r, s)
	}
	const folReads, calls = "lodestone_follower_leader_reads_total", "lodestone_leader_index_calls_total"
	f0, c0 := gauge(t, c.servers[fol], folReads), gauge(t, c.servers[fol], calls)
	if r, s := read(follower, fol, nil); r != 0 || s != 0 {
		t.Errorf("default mode on a follower: %v ReadIndex rounds, %v leader reads; want 0, 0", r, s)
	}
	if f, n := gauge(t, c.servers[fol], folReads)-f0, gauge(t, c.servers[fol], calls)-c0; f != 1 || n != 1 {
		t.Errorf("default mode on a follower: %v follower reads, %v leader index calls; want 1, 1", f, n)
	}
	if r, s := read(follower, fol, &consul.QueryOptions{AllowStale: true}); r != 0 || s != 0 {
		t.Errorf("?stale on a follower: %v ReadIndex rounds, %v leader reads; want 0, 0", r, s)
	}
}

// A follower's default-mode read sees every write the leader acknowledged
// before it began, with readers racing writers: without the leader's
// commit index a follower answers from whatever it has applied, which
// trails the leader's acknowledgement by up to a heartbeat.
func TestConsulFollowerDefaultReadSeesAcknowledgedWrites(t *testing.T) {
	c := newTestCluster(t, 3)
	const writers, rounds = 4, 50
	// NB: the counts hold only while fol stays a follower of one leader;
	// after an election forced by a loaded machine the round runs again.
	for attempt := range 3 {
		lead := c.waitLeader()
		fol := c.follower()
		term := c.servers[fol].raft.Status().Term
		reads0 := gauge(t, c.servers[fol], "lodestone_follower_leader_reads_total")
		calls0 := gauge(t, c.servers[fol], "lodestone_leader_index_calls_total")
		leader, follower := consulClient(t, c, lead).KV(), consulClient(t, c, fol).KV()
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Go(func() {
				key := fmt.Sprintf("ryw/%d/%d", attempt, w)
				for i := range rounds {
					want := strconv.Itoa(i)
					if _, err := leader.Put(&consul.KVPair{Key: key, Value: []byte(want)}, nil); err != nil {
						errs <- fmt.Errorf("put %s=%s on the leader: %w", key, want, err)
						return
					}
					pair, _, err := follower.Get(key, nil)
					if err != nil || pair == nil || string(pair.Value) != want {
						errs <- fmt.Errorf("get %s on a follower right after writing %s: %+v, %v", key, want, pair, err)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		// NB: what a read returned must hold across elections too.
		for err := range errs {
			t.Error(err)
		}
		if st := c.servers[fol].raft.Status(); st.Term != term {
			t.Logf("round %d: term moved from %d to %d under %s; counting again", attempt, term, st.Term, fol)
			continue
		}
		reads := gauge(t, c.servers[fol], "lodestone_follower_leader_reads_total") - reads0
		calls := gauge(t, c.servers[fol], "lodestone_leader_index_calls_total") - calls0
		if reads < writers*rounds || calls > reads {
			t.Errorf("follower served %v default-mode reads with %v leader index calls; want %d reads, calls at most reads", reads, calls, writers*rounds)
		}
		return
	}
	t.Fatal("every round saw an election; the machine is too loaded to count reads")
}

// Blocking queries parked on a follower and woken one write at a time
// each answer with the write that woke them, and share the leader index
// calls: a read began when its query parked, so a call sent after that
// settles it, and the first wake-up's call serves the rest. One call per
// wake-up was as many calls to the leader as writes.
func TestConsulFollowerWokenQueriesShareLeaderIndexCalls(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	fol := c.follower()
	leader, follower := consulClient(t, c, lead).KV(), consulClient(t, c, fol).KV()
	const queries = 20
	key := func(i int) string { return fmt.Sprintf("woken/%02d", i) }
	for i := range queries {
		if _, err := leader.Put(&consul.KVPair{Key: key(i), Value: []byte("old")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	_, meta, err := leader.Get(key(queries-1), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.waitApplied(fol, meta.LastIndex)
	const inFlight = "lodestone_blocking_queries_in_flight"
	base := gauge(t, c.servers[fol], inFlight)
	got := make(chan error, queries)
	for i := range queries {
		go func() {
			pair, _, err := follower.Get(key(i), &consul.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: time.Minute})
			switch {
			case err != nil:
				got <- fmt.Errorf("blocking get %s: %w", key(i), err)
			case pair == nil || string(pair.Value) != "new":
				got <- fmt.Errorf("blocking get %s woke with %+v, want the value new", key(i), pair)
			default:
				got <- nil
			}
		}()
	}
	waitFor(t, 10*time.Second, func() bool { return gauge(t, c.servers[fol], inFlight)-base == queries })
	const calls = "lodestone_leader_index_calls_total"
	before := gauge(t, c.servers[fol], calls)
	for i := range queries {
		if _, err := leader.Put(&consul.KVPair{Key: key(i), Value: []byte("new")}, nil); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}
	// NB: the first wake-up asks; a later one asks again only if it
	// parked after that call went out, and all of these parked before.
	if n := gauge(t, c.servers[fol], calls) - before; n != 1 {
		t.Errorf("%d queries woken on a follower made %v leader index calls; want 1, sent after they all parked", queries, n)
	}
}
