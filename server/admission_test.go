package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/store"
)

func storePolicy(t *testing.T, st *store.Store, index uint64, p *lodestonepb.AdmissionPolicy) {
	t.Helper()
	st.Apply(index, &lodestonepb.Command{Op: &lodestonepb.Command_Admission{Admission: p}})
	if got, at := st.Admission(); at != index || got.GetEnabled() != p.GetEnabled() {
		t.Fatalf("store admission %v at %d, want %v at %d", got, at, p, index)
	}
}

// fakeClockAdmission is an admission over a fresh store whose time is
// *clock (tests move it), started an hour before it.
func fakeClockAdmission(maxHint time.Duration) (*store.Store, *admission, *time.Time) {
	st := store.New()
	a := newAdmission(st, prometheus.NewRegistry(), maxHint, DefaultConfig().AdmissionSetupBurst, 0)
	clock := time.Unix(1000, 0)
	a.now = func() time.Time { return clock }
	a.started = clock.Add(-time.Hour)
	return st, a, &clock
}

// TestAdmissionBucketAndRamp steps a fake clock through a ramp: the
// admitted rate starts at the ramp percent and grows each minute.
func TestAdmissionBucketAndRamp(t *testing.T) {
	st, a, clock := fakeClockAdmission(DefaultConfig().AdmissionMaxRetryHint)
	admitted := func(c, n int) int {
		ok := 0
		for range n {
			if yes, _ := a.admit(c, 1); yes {
				ok++
			}
		}
		return ok
	}
	if got, want := admitted(classWrite, 100), 100; got != want {
		t.Fatalf("no policy: admitted %d of 100, want %d", got, want)
	}
	storePolicy(t, st, 1, &lodestonepb.AdmissionPolicy{Enabled: true, Writes: 100, RampPercentPerMin: 10, SetUnixNano: clock.UnixNano()})
	if got, want := admitted(classWrite, 50), 10; got != want {
		t.Errorf("ramp at 10%% of 100/s: admitted %d in one instant, want %d", got, want)
	}
	// 40 were refused before it, each booking the next 100ms slot.
	if ok, wait := a.admit(classWrite, 1); ok || wait < 4*time.Second || wait > 4200*time.Millisecond {
		t.Errorf("over the limit behind 40 refused: admitted %v, retry after %v; want refused with about 4.1s", ok, wait)
	}
	*clock = clock.Add(5 * time.Second) // the booked slots pass
	if got, want := admitted(classRead, 100), 100; got != want {
		t.Errorf("reads have no limit: admitted %d, want %d", got, want)
	}
	*clock = clock.Add(time.Minute - 5*time.Second) // a minute after the policy
	if got := rampFraction(a.policy(*clock), a.started, *clock); got < 0.199 || got > 0.201 {
		t.Errorf("one minute into a 10%%/min ramp: fraction %v, want 0.2", got)
	}
	if got, want := admitted(classWrite, 100), 20; got != want {
		t.Errorf("after a minute: admitted %d, want %d", got, want)
	}
	*clock = clock.Add(time.Hour)
	if got, want := admitted(classWrite, 200), 100; got != want {
		t.Errorf("ramp complete: admitted %d, want %d (the full limit)", got, want)
	}
	// A server restarted long after the policy was set ramps up again.
	a.started = *clock
	a.buckets = [numClasses]bucket{}
	if got, want := admitted(classWrite, 200), 10; got != want {
		t.Errorf("just restarted: admitted %d, want %d (the ramp starts again)", got, want)
	}
	storePolicy(t, st, 2, &lodestonepb.AdmissionPolicy{})
	if got, want := admitted(classWrite, 500), 500; got != want {
		t.Errorf("policy off: admitted %d, want %d", got, want)
	}
}

// TestAdmissionGetManyCostsEachKey: a GetMany takes a read token for each
// key: admitted while one token is left, it leaves the bucket in debt,
// and the reads after it wait the debt out.
func TestAdmissionGetManyCostsEachKey(t *testing.T) {
	st, a, clock := fakeClockAdmission(time.Minute)
	storePolicy(t, st, 1, &lodestonepb.AdmissionPolicy{Enabled: true, Reads: 10, SetUnixNano: clock.Add(-time.Hour).UnixNano()})
	many := &lodestonepb.GetManyRequest{Keys: make([][]byte, 20)}
	if got := rpcCost(many); got != 20 {
		t.Fatalf("cost of a GetMany of 20 keys: %d", got)
	}
	if ok, _ := a.admit(classRead, rpcCost(many)); !ok {
		t.Fatal("a GetMany of 20 keys refused with a full bucket of 10")
	}
	// 10 - 20 = -10 tokens: the next one is due in 1.1s at 10/s.
	if ok, wait := a.admit(classRead, rpcCost(&lodestonepb.GetRequest{})); ok || wait < 1090*time.Millisecond || wait > 1110*time.Millisecond {
		t.Fatalf("a Get after it: admitted %v, retry after %v; want refused for about 1.1s", ok, wait)
	}
	*clock = clock.Add(1200 * time.Millisecond)
	if ok, _ := a.admit(classRead, 1); !ok {
		t.Fatal("a Get once the debt is repaid was refused")
	}
}

// TestAdmissionWatchBurst: watch creates, each a replay to set up, come
// AdmissionSetupBurst's worth at once (50ms by default); reads and writes
// a second's worth.
func TestAdmissionWatchBurst(t *testing.T) {
	st, a, _ := fakeClockAdmission(DefaultConfig().AdmissionMaxRetryHint)
	storePolicy(t, st, 1, &lodestonepb.AdmissionPolicy{Enabled: true, Reads: 400, Writes: 400, Watches: 400, SetUnixNano: 1})
	for _, tc := range []struct {
		class int
		want  int
	}{{classRead, 400}, {classWrite, 400}, {classWatch, 20}} {
		ok := 0
		for range 1000 {
			if yes, _ := a.admit(tc.class, 1); yes {
				ok++
			}
		}
		if ok != tc.want {
			t.Errorf("%s at 400/s: %d admitted at once, want %d", classNames[tc.class], ok, tc.want)
		}
	}
}

// TestAdmissionSpreadsRetries refuses a burst of clients that each come
// back when told, on a fake clock: every refused client books its own
// slot, so each is refused about once and all get in at the admitted
// rate, rather than all coming back at the next token and being refused
// again and again. The hint never exceeds maxRetryHint.
func TestAdmissionSpreadsRetries(t *testing.T) {
	st, a, clock := fakeClockAdmission(DefaultConfig().AdmissionMaxRetryHint)
	storePolicy(t, st, 1, &lodestonepb.AdmissionPolicy{Enabled: true, Watches: 10, SetUnixNano: clock.UnixNano()})

	const clients = 200
	due := make([]time.Time, clients) // when each client tries next; zero: admitted
	for i := range due {
		due[i] = *clock
	}
	refusals, last := 0, *clock
	for {
		next := -1
		for i, d := range due {
			if !d.IsZero() && (next < 0 || d.Before(due[next])) {
				next = i
			}
		}
		if next < 0 {
			break
		}
		*clock = due[next]
		ok, wait := a.admit(classWatch, 1)
		if ok {
			due[next], last = time.Time{}, *clock
			continue
		}
		refusals++
		if wait < minRetryHint || wait > a.maxHint {
			t.Fatalf("retry hint %v outside [%v, %v]", wait, minRetryHint, a.maxHint)
		}
		due[next] = clock.Add(wait + time.Millisecond) // a client comes back a little after its slot
		if refusals > 10*clients {
			t.Fatalf("%d refusals for %d clients: a retry storm", refusals, clients)
		}
	}
	// 10 get in at once (a second of tokens), the other 190 one per 100ms.
	if refusals > 2*(clients-10) {
		t.Errorf("%d refusals for %d refused clients; want each refused about once", refusals, clients-10)
	}
	if took := last.Sub(time.Unix(1000, 0)); took > 25*time.Second {
		t.Errorf("the last client got in after %v; want about 19s at 10/s", took)
	}

	// A burst far beyond what the cap holds is told the cap.
	for range 1000 {
		a.admit(classWatch, 1)
	}
	if _, wait := a.admit(classWatch, 1); wait != a.maxHint {
		t.Errorf("after 1000 refusals at 10/s the hint is %v, want the cap %v", wait, a.maxHint)
	}
}

// TestAdmissionRetryHintCap refuses a burst at 10 writes/s under a 2s
// cap: the first refused book slots 100ms apart up to the cap, every
// hint after is the cap, and the counter counts exactly those; a cap
// the burst never reaches counts none. The configured cap is validated.
func TestAdmissionRetryHintCap(t *testing.T) {
	burst := func(maxHint time.Duration) (capped float64, hints []time.Duration) {
		st, a, clock := fakeClockAdmission(maxHint)
		storePolicy(t, st, 1, &lodestonepb.AdmissionPolicy{Enabled: true, Writes: 10, SetUnixNano: clock.UnixNano()})
		for range 100 {
			if ok, wait := a.admit(classWrite, 1); !ok {
				hints = append(hints, wait)
			}
		}
		if got := testutil.ToFloat64(a.capped.WithLabelValues("read")); got != 0 {
			t.Errorf("reads were never refused, yet %v read hints were capped", got)
		}
		return testutil.ToFloat64(a.capped.WithLabelValues("write")), hints
	}
	capped, hints := burst(2 * time.Second)
	if len(hints) != 90 {
		t.Fatalf("%d of 100 writes refused at 10/s, want 90 (a second of tokens gets in)", len(hints))
	}
	atCap := 0
	for i, h := range hints {
		if h > 2*time.Second {
			t.Fatalf("hint %d is %v, over the 2s cap", i, h)
		}
		if h == 2*time.Second {
			atCap++
		}
	}
	// Slots 100ms apart reach 2s at the 20th refusal; the 70 after it
	// would have been told more.
	if atCap < 70 || atCap > 71 || capped != 70 {
		t.Errorf("%d hints at the cap, %v counted capped; want 70 cut to the cap and counted", atCap, capped)
	}
	if capped, hints := burst(time.Minute); capped != 0 || hints[len(hints)-1] < 8*time.Second {
		t.Errorf("under a 1m cap: %v capped, last hint %v; want none capped and about 9s", capped, hints[len(hints)-1])
	}

	for _, tc := range []struct {
		field string
		set   func(*Config, time.Duration)
		ok    map[time.Duration]bool
	}{
		{"admission-max-retry-hint", func(c *Config, d time.Duration) { c.AdmissionMaxRetryHint = d },
			map[time.Duration]bool{500 * time.Millisecond: false, time.Second: true, 30 * time.Second: true, 10 * time.Minute: true, 11 * time.Minute: false}},
		{"admission-setup-burst", func(c *Config, d time.Duration) { c.AdmissionSetupBurst = d },
			map[time.Duration]bool{0: false, 500 * time.Microsecond: false, time.Millisecond: true, 50 * time.Millisecond: true, time.Second: true, 2 * time.Second: false}},
		{"admission-max-sched-delay", func(c *Config, d time.Duration) { c.AdmissionMaxSchedDelay = d },
			map[time.Duration]bool{-time.Millisecond: false, 0: true, 500 * time.Microsecond: false, time.Millisecond: true, 10 * time.Millisecond: true, time.Second: true, 2 * time.Second: false}},
	} {
		for d, ok := range tc.ok {
			cfg := singleMemberConfig(t)
			tc.set(&cfg, d)
			err := cfg.Validate()
			var ce *ConfigError
			if ok && err != nil {
				t.Errorf("--%s %v was refused: %v", tc.field, d, err)
			}
			if !ok && (!errors.As(err, &ce) || ce.Field != tc.field) {
				t.Errorf("--%s %v: Validate() = %v, want a ConfigError on %s", tc.field, d, err, tc.field)
			}
		}
	}
}

func TestGRPCAndHTTPClasses(t *testing.T) {
	for method, want := range map[string]int{
		"/lodestone.v1.KV/Put": classWrite, "/lodestone.v1.KV/Range": classRead, "/lodestone.v1.Watch/Watch": classWatch,
		"/lodestone.v1.Catalog/Register": classWrite, "/lodestone.v1.Catalog/Nodes": classRead,
		"/lodestone.v1.Session/Renew": classWrite, "/lodestone.v1.Cluster/Status": -1,
		"/lodestone.v1.Admin/SetAdmission": -1, "/lodestone.v1.Peer/Stream": -1, "/grpc.health.v1.Health/Check": -1,
	} {
		if got := grpcClass(method); got != want {
			t.Errorf("grpcClass(%s) = %d, want %d", method, got, want)
		}
	}
	for _, tc := range []struct {
		method, url string
		want        int
	}{
		{"GET", "/v1/kv/a", classRead}, {"PUT", "/v1/kv/a", classWrite}, {"GET", "/v1/health/service/web?index=7", classWatch},
		{"PUT", "/v1/txn", classWrite}, {"GET", "/metrics", -1}, {"GET", "/healthz", -1}, {"GET", "/v1/status/leader", -1},
	} {
		r, _ := http.NewRequest(tc.method, tc.url, nil)
		if got := httpClass(r); got != tc.want {
			t.Errorf("httpClass(%s %s) = %d, want %d", tc.method, tc.url, got, tc.want)
		}
	}
}

// TestAdmissionReplicated sets a policy on one member of a real
// three-node cluster and checks that every member enforces it over gRPC
// and HTTP, that admin and health endpoints are never refused, that the Go
// client gets its writes through by backing off, that the policy survives a
// restart from a snapshot, and that "off" lifts it.
func TestAdmissionReplicated(t *testing.T) {
	c := newTestCluster(t, 3, withSnapshotEvery(5, 2))
	c.waitLeader()
	admin := lodestonepb.NewAdminClient(c.conn("n1"))
	pol := &lodestonepb.AdmissionPolicy{Enabled: true, Reads: 5, Writes: 5}
	if err := retryUnavailable(t, func(ctx context.Context) error {
		_, err := admin.SetAdmission(ctx, &lodestonepb.SetAdmissionRequest{Policy: pol})
		return err
	}); err != nil {
		t.Fatalf("set admission: %v", err)
	}
	if _, err := admin.SetAdmission(ctxT(t), &lodestonepb.SetAdmissionRequest{Policy: &lodestonepb.AdmissionPolicy{Enabled: true, RampPercentPerMin: 500}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("bad policy: err = %v, want InvalidArgument", err)
	}

	for _, name := range c.names {
		kv := c.kv(name)
		refused := 0
		for i := range 30 {
			_, err := kv.Put(ctxT(t), &lodestonepb.PutRequest{Key: []byte(fmt.Sprintf("%s/%d", name, i)), Value: []byte("v")})
			if status.Code(err) == codes.ResourceExhausted {
				refused++
				if hint := retryHintOf(err); hint <= 0 {
					t.Errorf("%s: RESOURCE_EXHAUSTED without a RetryInfo: %v", name, err)
				}
				continue
			}
			if err != nil && status.Code(err) != codes.Unavailable {
				t.Fatalf("%s: put: %v", name, err)
			}
		}
		if refused == 0 {
			t.Errorf("%s admitted 30 writes at once under a limit of 5/s", name)
		}
		for range 30 {
			if _, err := c.cluster(name).Status(ctxT(t), &lodestonepb.StatusRequest{}); err != nil {
				t.Fatalf("%s: status is never gated: %v", name, err)
			}
		}
	}

	httpAddr := c.servers["n3"].HTTPAddr()
	saw429 := false
	for range 30 {
		resp, err := http.Get("http://" + httpAddr + "/v1/kv/n3/0")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			saw429 = true
			if resp.Header.Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
		}
	}
	if !saw429 {
		t.Error("30 HTTP reads at once under a limit of 5/s: no 429")
	}
	for _, path := range []string{"/metrics", "/healthz"} {
		for range 20 {
			resp, err := http.Get("http://" + httpAddr + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests {
				t.Fatalf("%s was refused by admission control", path)
			}
		}
	}

	// The Go client backs off as told and gets every write through.
	cl, err := client.New(client.Config{Endpoints: []string{c.servers["n2"].GRPCAddr()}, RequestTimeout: 10 * time.Second, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	start := time.Now()
	for i := range 15 {
		if _, err := cl.Put(ctxT(t), fmt.Sprintf("client/%d", i), []byte("v")); err != nil {
			t.Fatalf("client put %d under admission control: %v", i, err)
		}
	}
	t.Logf("15 client writes at 5/s took %v", time.Since(start).Round(time.Millisecond))

	// A restarted member reads the policy from its snapshot, and lets
	// gated requests in once it has applied what its log held committed.
	c.stop("n3")
	c.start("n3", false)
	waitFor(t, 10*time.Second, func() bool {
		p := c.servers["n3"].adm.policy(time.Now().Add(time.Hour))
		return p != nil && p.GetWrites() == 5
	})
	n3 := c.servers["n3"]
	select {
	case <-n3.adm.replayed:
	case <-time.After(10 * time.Second):
		t.Fatal("restarted n3 never finished replaying its log")
	}
	if at, applied := n3.raft.CommittedAtStart(), n3.raft.Applied(); at == 0 || applied < at {
		t.Errorf("restarted n3: committed at start %d, applied %d; want a nonzero index, applied", at, applied)
	}

	c.waitLeader()
	// Setting a policy is idempotent: retried also when a leader change
	// (the restart) left its outcome unknown.
	if err := retryUnavailable(t, func(ctx context.Context) error {
		_, err := admin.SetAdmission(ctx, &lodestonepb.SetAdmissionRequest{Policy: &lodestonepb.AdmissionPolicy{}})
		if status.Code(err) == codes.Aborted {
			return status.Error(codes.Unavailable, "retry: "+err.Error())
		}
		return err
	}); err != nil {
		t.Fatalf("admission off: %v", err)
	}
	kv := c.kv("n1")
	waitFor(t, 5*time.Second, func() bool {
		for i := range 30 {
			if _, err := kv.Put(ctxT(t), &lodestonepb.PutRequest{Key: []byte(fmt.Sprintf("off/%d", i)), Value: []byte("v")}); err != nil {
				return false
			}
		}
		return true
	})
}

func retryHintOf(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// TestAdmissionAcceptWait steps a fake clock through the connection rate:
// AdmissionSetupBurst's worth of accepts at once (50ms by default, at
// least one), then one per 1/rate, ramped like the request classes.
func TestAdmissionAcceptWait(t *testing.T) {
	st, a, clock := fakeClockAdmission(DefaultConfig().AdmissionMaxRetryHint)
	accepted := func(n int) int {
		ok := 0
		for range n {
			if wait, _ := a.acceptWait(); wait == 0 {
				ok++
			}
		}
		return ok
	}
	if got := accepted(1000); got != 1000 {
		t.Fatalf("no policy: %d of 1000 accepted at once, want all", got)
	}
	storePolicy(t, st, 1, &lodestonepb.AdmissionPolicy{Enabled: true, Reads: 5, SetUnixNano: clock.UnixNano()})
	if got := accepted(1000); got != 1000 {
		t.Fatalf("a policy without a connection rate: %d of 1000 accepted at once, want all", got)
	}
	storePolicy(t, st, 2, &lodestonepb.AdmissionPolicy{Enabled: true, Connections: 200, RampPercentPerMin: 10, SetUnixNano: clock.UnixNano()})
	if got, want := accepted(100), 1; got != want {
		t.Errorf("ramp at 10%% of 200/s: %d accepted at once, want %d (50ms of 20/s, at least one)", got, want)
	}
	if wait, _ := a.acceptWait(); wait < 49*time.Millisecond || wait > 51*time.Millisecond {
		t.Errorf("empty bucket at 20/s: wait %v, want 50ms", wait)
	}
	*clock = clock.Add(50 * time.Millisecond)
	if got, want := accepted(5), 1; got != want {
		t.Errorf("50ms later at 20/s: %d accepted, want %d", got, want)
	}
	*clock = clock.Add(time.Hour)
	if got, want := accepted(1000), 10; got != want {
		t.Errorf("ramp complete: %d accepted at once, want %d (50ms of the full rate)", got, want)
	}
	*clock = clock.Add(time.Second)
	if got, want := accepted(1000), 10; got != want {
		t.Errorf("a second idle: %d accepted at once, want %d (the bucket holds 50ms)", got, want)
	}
	if got := testutil.ToFloat64(a.limit.WithLabelValues(connectionClass)); got != 200 {
		t.Errorf("admission_limit_per_second{class=connection} = %v, want 200", got)
	}
	// At 100/s a millisecond refills a tenth of a token, and ten tenths
	// add up to a hair under one: that must wait, not pass for a token.
	storePolicy(t, st, 3, &lodestonepb.AdmissionPolicy{Enabled: true, Connections: 100, SetUnixNano: clock.UnixNano()})
	for accepted(1) == 1 {
	}
	n := 0
	for range 1000 {
		*clock = clock.Add(time.Millisecond)
		n += accepted(1)
	}
	if n < 99 || n > 100 {
		t.Errorf("one accept a millisecond at 100/s for 1s: %d accepted, want 100 (99 if rounding lost a token)", n)
	}
}

// TestConnectionRatePacesAccepts dials a burst of real TCP connections at
// a listener paced to 20 a second: one is accepted at once (50ms of 20/s,
// at least one), the rest wait in the backlog and come in one per
// 50ms, none refused; closing the listener ends a paced wait.
func TestConnectionRatePacesAccepts(t *testing.T) {
	st := store.New()
	a := newAdmission(st, prometheus.NewRegistry(), DefaultConfig().AdmissionMaxRetryHint, DefaultConfig().AdmissionSetupBurst, 0)
	storePolicy(t, st, 1, &lodestonepb.AdmissionPolicy{Enabled: true, Connections: 20, SetUnixNano: time.Now().UnixNano()})
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newConnLimit(inner, 100, prometheus.NewCounter(prometheus.CounterOpts{Name: "refused"}))
	l.pace = a.paceAccept
	defer l.Close()

	const n = 12
	var dialed []net.Conn
	defer func() {
		for _, c := range dialed {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatalf("dial: %v (the backlog should hold a burst of %d)", err, n)
		}
		dialed = append(dialed, c)
	}
	start := time.Now()
	var last time.Duration
	for i := range n {
		c, err := l.Accept()
		if err != nil {
			t.Fatalf("accept %d: %v", i, err)
		}
		defer c.Close()
		last = time.Since(start)
	}
	// 11 after the first, at 20/s: at least 550ms less a token's
	// rounding.
	if last < 500*time.Millisecond {
		t.Errorf("%d connections at 20/s were all accepted within %v; want the last 11 paced over about 550ms", n, last)
	}
	if got := testutil.ToFloat64(a.acceptWaits); got < 10 {
		t.Errorf("admission_accept_waits_total = %v, want at least 10", got)
	}
	t.Logf("%d connections at 20/s accepted in %v", n, last.Round(time.Millisecond))

	// With the clock stopped the bucket never refills, so the next accept
	// waits until Close ends it; a connection already waits in the
	// backlog, so an accept that skipped the wait would return it.
	stopped := time.Now()
	a.now = func() time.Time { return stopped }
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	dialed = append(dialed, c)
	pacing := make(chan struct{})
	l.pace = func(done <-chan struct{}) bool {
		close(pacing)
		return a.paceAccept(done)
	}
	done := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		done <- err
	}()
	<-pacing // NB: Close before the accept starts would end it at the slot instead
	l.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("accept after close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a paced accept did not end when the listener closed")
	}
}

// replayGate is a replayLog whose apply the test releases.
type replayGate struct {
	committed uint64
	asked     chan uint64
	release   chan error
}

func (g *replayGate) CommittedAtStart() uint64 { return g.committed }

func (g *replayGate) WaitApplied(ctx context.Context, index uint64) error {
	g.asked <- index
	return <-g.release
}

// TestAdmissionHoldsUntilReplayed: a restarted server holds gated
// requests until it has applied what its log held committed, then holds
// them to the policy that log carried; the never gated services and
// client accepts pass meanwhile.
func TestAdmissionHoldsUntilReplayed(t *testing.T) {
	st := store.New()
	a := newAdmission(st, prometheus.NewRegistry(), DefaultConfig().AdmissionMaxRetryHint, DefaultConfig().AdmissionSetupBurst, 0)
	gate := &replayGate{committed: 42, asked: make(chan uint64, 1), release: make(chan error)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.replay(context.Background(), gate)
	}()
	if got := <-gate.asked; got != 42 {
		t.Fatalf("replay waited for index %d, want the commit index at start, 42", got)
	}
	if got := testutil.ToFloat64(a.replaying); got != 1 {
		t.Errorf("admission_replaying = %v while replaying, want 1", got)
	}

	served := 0
	handler := func(context.Context, any) (any, error) { served++; return nil, nil }
	put := &grpc.UnaryServerInfo{FullMethod: "/lodestone.v1.KV/Put"}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.unary(gone, nil, put, handler); status.Code(err) != codes.Canceled || served != 0 {
		t.Fatalf("a put whose caller left while replaying: err %v, served %d; want Canceled, not served", err, served)
	}
	if _, err := a.unary(gone, nil, &grpc.UnaryServerInfo{FullMethod: "/lodestone.v1.Cluster/Status"}, handler); err != nil || served != 1 {
		t.Fatalf("Cluster.Status while replaying: err %v, served %d; want served at once", err, served)
	}
	rec := httptest.NewRecorder()
	a.http(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequestWithContext(gone, http.MethodPut, "/v1/kv/a", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("an HTTP write whose caller left while replaying: %d, want 503", rec.Code)
	}
	closed := make(chan struct{})
	close(closed)
	if !a.paceAccept(closed) {
		t.Error("paceAccept waited while replaying (no policy is known to pace by)")
	}

	// The replayed log carries a policy of one write a second.
	storePolicy(t, st, 7, &lodestonepb.AdmissionPolicy{Enabled: true, Writes: 1, SetUnixNano: time.Now().UnixNano()})
	held := make(chan error, 1)
	go func() {
		_, err := a.unary(context.Background(), nil, put, handler)
		held <- err
	}()
	gate.release <- nil
	<-done
	if err := <-held; err != nil {
		t.Fatalf("the held put after replay: %v", err)
	}
	if _, err := a.unary(context.Background(), nil, put, handler); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a second put at one a second after replay: %v, want RESOURCE_EXHAUSTED", err)
	}
	if served != 2 {
		t.Errorf("served %d, want 2 (the status call and the held put)", served)
	}
	if got := testutil.ToFloat64(a.replaying); got != 0 {
		t.Errorf("admission_replaying = %v after replay, want 0", got)
	}
}
