package gateway_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/gateway"
)

var churnDuration = flag.Duration("churn-duration", 0,
	"how long TestChurn churns (default 10s; GATEWAY_CHURN=full or -churn-duration=60s runs the full 60s version)")

// churnSlot is one origin listener. It is registered under a new instance
// id (a new generation) each time it comes back.
type churnSlot struct {
	o *origin

	mu        sync.Mutex
	state     int       // slotFree, slotBusy (a write in flight), slotRegistered
	gen       int       // generation of the current or last registration
	freeSince time.Time // when it was last deregistered
	intervals [][2]uint64
}

const (
	slotFree = iota
	slotBusy
	slotRegistered
)

// registeredDuring reports whether the slot was registered at some index
// in [lo, hi]: its intervals are [registered, deregistered) pairs, the
// last one open (0) if it is registered now.
func (s *churnSlot) registeredDuring(lo, hi uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, iv := range s.intervals {
		end := iv[1]
		if end == 0 {
			end = ^uint64(0)
		}
		if iv[0] <= hi && lo < end {
			return true
		}
	}
	return false
}

// sample is one request through the gateway: the table index just before
// it was sent and just after its answer (the gateway routed it by a table
// in between), which slot answered, and how.
type sample struct {
	before, after uint64
	slot          int
	status        int
	err           string
	at            time.Duration
}

// TestChurn: 200 origin instances behind the gateway, steady load, and
// 1,000 registrations plus 1,000 deregistrations per second (every 200ms
// the whole fleet is replaced), written to a real registry in small
// transactions and followed by the KVSource's one watch stream. Asserted:
//
//   - no request reaches an instance at a time its deregistration was
//     applied: every request's answering slot was registered at some table
//     index between the one the client saw before sending and after the
//     answer (the gateway routed it by a table in that range);
//   - no 5xx and no failed request is caused by the churn;
//   - connections opened to origins per second stay within what the
//     subsets allow: each registration enters exactly one subset, held by
//     Shards/subsets shards, so ≤ 2 × replication × registrations of that
//     second and the one before (2: a second connection when a pool sees
//     two requests at once), where a gateway without subsetting would open
//     up to Shards per registration;
//   - when the churn stops, the gateway's table equals the registry's.
//
// It runs 10s by default; GATEWAY_CHURN=full (or -churn-duration=60s)
// runs the full 60s. Under -race the achieved rate need only reach 50%
// (90% otherwise): the race detector slows the registry, not the gateway's
// invariants.
func TestChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("churn test skipped in -short mode")
	}
	const (
		instances = 200
		slots     = 500
		regRate   = 1000 // registrations per second, and as many deregistrations
		batch     = 8    // registrations (and deregistrations) per registry transaction
		cooldown  = 100 * time.Millisecond
		clients   = 16
		pace      = 8 * time.Millisecond // each load client sends at most one request per pace: ≤ 2,000 requests/s
		writers   = 32
	)
	dur := 10 * time.Second
	if os.Getenv("GATEWAY_CHURN") == "full" {
		dur = 60 * time.Second
	}
	if *churnDuration > 0 {
		dur = *churnDuration
	}
	t.Logf("churn: %d instances, %d registrations + %d deregistrations/s (%d of each per transaction) for %v, %d load clients",
		instances, regRate, regRate, batch, dur, clients)

	reg := startRegistry(t)
	src := reg.kvSource(t)
	ctx := testCtx(t, dur+3*time.Minute)

	ss := make([]*churnSlot, slots)
	for i := range ss {
		slot := i
		ss[i] = &churnSlot{o: startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Slot", strconv.Itoa(slot))
			io.WriteString(w, "ok")
		}), false)}
	}
	id := func(i, gen int) string { return fmt.Sprintf("s%d-g%d", i, gen) }
	register := func(i int) error {
		s := ss[i]
		s.mu.Lock()
		s.gen++
		in := s.o.instance("churn", id(i, s.gen), nil)
		s.mu.Unlock()
		idx, err := src.PutInstance(ctx, in)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.intervals = append(s.intervals, [2]uint64{idx, 0})
		s.state = slotRegistered
		s.mu.Unlock()
		return nil
	}

	if _, err := src.PutRoute(ctx, gateway.Route{Name: "churn", PathPrefix: "/", Service: "churn"}); err != nil {
		t.Fatal(err)
	}
	for i := range instances {
		if err := register(i); err != nil {
			t.Fatal(err)
		}
	}
	for i := instances; i < slots; i++ {
		ss[i].freeSince = time.Now().Add(-cooldown)
	}
	cfg := testConfig(t, src)
	cfg.Shards, cfg.SubsetSize, cfg.Replication = 16, 25, 2 // the defaults: 200 origins → 8 subsets of 25, each held by 2 shards
	cfg.Logger = nil                                        // per-update debug logs would dominate the run
	g := startGateway(t, cfg)
	var lastIdx uint64
	for _, s := range ss[:instances] {
		lastIdx = max(lastIdx, s.intervals[0][0])
	}
	if err := g.WaitIndex(ctx, lastIdx); err != nil {
		t.Fatal(err)
	}
	const replication = 16 / 8

	// Steady load.
	c := httpClient(t)
	c.Transport.(*http.Transport).MaxIdleConnsPerHost = clients
	var (
		samplesMu sync.Mutex
		samples   []sample
		stop      atomic.Bool
		loadWG    sync.WaitGroup
		begin     = time.Now()
	)
	for range clients {
		loadWG.Go(func() {
			var mine []sample
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for !stop.Load() {
				<-tick.C
				s := sample{before: g.Index(), slot: -1, at: time.Since(begin)}
				resp, err := c.Get("http://" + g.Addr() + "/x")
				if err != nil {
					s.err = err.Error()
				} else {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					s.status = resp.StatusCode
					if v := resp.Header.Get("X-Slot"); v != "" {
						s.slot, _ = strconv.Atoi(v)
					}
				}
				s.after = g.Index()
				mine = append(mine, s)
			}
			samplesMu.Lock()
			samples = append(samples, mine...)
			samplesMu.Unlock()
		})
	}

	// Connections opened, sampled every second, against registrations.
	type second struct{ opened, regs int64 }
	var (
		regsDone atomic.Int64
		perSec   []second
		monWG    sync.WaitGroup
		monStop  = make(chan struct{})
	)
	monWG.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		lastOpened, lastRegs := g.Stats().ConnectionsOpened, regsDone.Load()
		for {
			select {
			case <-monStop:
				return
			case <-tick.C:
			}
			o, r := g.Stats().ConnectionsOpened, regsDone.Load()
			perSec = append(perSec, second{opened: o - lastOpened, regs: r - lastRegs})
			lastOpened, lastRegs = o, r
		}
	})

	// Churn: writers take tokens at regRate/batch per second; each token
	// deregisters up to batch random registered slots and registers up to
	// batch cooled free ones in one registry transaction (as an agent
	// flushing a burst of changes would).
	var (
		pickMu   sync.Mutex
		rng      = rand.New(rand.NewPCG(rand.Uint64(), 9))
		tokens   = make(chan struct{}, 4*writers)
		churnWG  sync.WaitGroup
		writeErr atomic.Value
		deregs   atomic.Int64
	)
	pick := func(want int, cooled bool) int {
		pickMu.Lock()
		defer pickMu.Unlock()
		for range 4 * slots {
			i := rng.IntN(slots)
			s := ss[i]
			s.mu.Lock()
			ok := s.state == want && (!cooled || time.Since(s.freeSince) >= cooldown)
			if ok {
				s.state = slotBusy
			}
			s.mu.Unlock()
			if ok {
				return i
			}
		}
		return -1
	}
	rawClient := reg.newClient(t)
	churnOnce := func() error {
		var ops []*lodestonepb.TxnOp
		var gone, added []int
		for range batch {
			if i := pick(slotRegistered, false); i >= 0 {
				s := ss[i]
				s.mu.Lock()
				key := src.InstanceKey("churn", id(i, s.gen))
				s.mu.Unlock()
				ops = append(ops, &lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_DELETE, Key: []byte(key)})
				gone = append(gone, i)
			}
			if i := pick(slotFree, true); i >= 0 {
				s := ss[i]
				s.mu.Lock()
				s.gen++
				key := src.InstanceKey("churn", id(i, s.gen))
				s.mu.Unlock()
				v, _ := json.Marshal(gateway.Instance{Address: s.o.host, Port: s.o.port, Healthy: true})
				ops = append(ops, &lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: []byte(key), Value: v})
				added = append(added, i)
			}
		}
		if len(ops) == 0 {
			return nil
		}
		resp, err := rawClient.Txn(ctx, ops)
		if err != nil {
			return err
		}
		if !resp.GetSucceeded() {
			return fmt.Errorf("churn transaction failed: %v", resp.GetErrors())
		}
		idx := resp.GetHeader().GetIndex()
		for _, i := range gone {
			s := ss[i]
			s.mu.Lock()
			s.intervals[len(s.intervals)-1][1] = idx
			s.state, s.freeSince = slotFree, time.Now()
			s.mu.Unlock()
		}
		for _, i := range added {
			s := ss[i]
			s.mu.Lock()
			s.intervals = append(s.intervals, [2]uint64{idx, 0})
			s.state = slotRegistered
			s.mu.Unlock()
		}
		deregs.Add(int64(len(gone)))
		regsDone.Add(int64(len(added)))
		return nil
	}
	for range writers {
		churnWG.Go(func() {
			for range tokens {
				if err := churnOnce(); err != nil {
					writeErr.Store(err)
					return
				}
			}
		})
	}
	churnStart := time.Now()
	tokenInterval := time.Second * batch / regRate
	next := churnStart
	for time.Since(churnStart) < dur && writeErr.Load() == nil {
		next = next.Add(tokenInterval)
		if d := time.Until(next); d > 0 {
			time.Sleep(d) // pacing the offered churn, not waiting for state
		}
		select {
		case tokens <- struct{}{}:
		default: // writers saturated: the achieved rate is checked below
		}
	}
	close(tokens)
	churnWG.Wait()
	churnTook := time.Since(churnStart)
	stop.Store(true)
	loadWG.Wait()
	close(monStop)
	monWG.Wait()
	if err := writeErr.Load(); err != nil {
		t.Fatalf("registry write failed: %v", err)
	}

	// The table converges to the registry's state.
	var want []string
	maxIdx := uint64(0)
	for i, s := range ss {
		s.mu.Lock()
		if s.state == slotRegistered {
			want = append(want, id(i, s.gen))
		}
		for _, iv := range s.intervals {
			maxIdx = max(maxIdx, iv[0], iv[1])
		}
		s.mu.Unlock()
	}
	if err := g.WaitIndex(ctx, maxIdx); err != nil {
		t.Fatal(err)
	}
	view := tableView(t, g)
	var got []string
	for _, o := range view.Services["churn"].Origins {
		got = append(got, o.ID)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("after the churn the gateway has %d origins, the registry %d (or different ones)", len(got), len(want))
	}

	// Achieved churn rate.
	regRateGot := float64(regsDone.Load()) / churnTook.Seconds()
	deregRateGot := float64(deregs.Load()) / churnTook.Seconds()
	t.Logf("churn: %d registrations and %d deregistrations in %v = %.0f + %.0f per second; %d requests",
		regsDone.Load(), deregs.Load(), churnTook.Round(time.Millisecond), regRateGot, deregRateGot, len(samples))
	// The churn must really have run at the rate: 90% of it, except under
	// the race detector, which slows the registry 5-10× on a shared
	// machine (the invariants below are what the race run is for).
	minShare := 0.9
	if raceEnabled {
		minShare = 0.5
	}
	if regRateGot < minShare*regRate || deregRateGot < minShare*regRate {
		t.Errorf("achieved %.0f registrations and %.0f deregistrations per second, want ≥ %.0f each (%.0f%% of %d)",
			regRateGot, deregRateGot, minShare*regRate, 100*minShare, regRate)
	}

	// Every request: answered 200 by a slot registered at a table index
	// the gateway could have routed it by.
	var failed, misrouted int
	for _, s := range samples {
		if s.err != "" || s.status != 200 {
			if failed < 5 {
				t.Errorf("request at %v: status %d err %q (churn must cause no failures)", s.at, s.status, s.err)
			}
			failed++
			continue
		}
		if s.slot < 0 || !ss[s.slot].registeredDuring(s.before, s.after) {
			if misrouted < 5 {
				t.Errorf("request at %v reached slot %d, not registered at any index in [%d, %d]: it reached an instance after its deregistration was applied",
					s.at, s.slot, s.before, s.after)
			}
			misrouted++
		}
	}
	if failed+misrouted > 0 {
		t.Errorf("%d failed and %d misrouted of %d requests", failed, misrouted, len(samples))
	}
	if len(samples) < int(dur.Seconds())*100 {
		t.Errorf("only %d requests in %v: the load was not steady", len(samples), dur)
	}

	// Connections opened per second vs what the subsets allow. A
	// registration acknowledged late in one second may be applied by the
	// gateway early in the next, so each second is held to the
	// registrations of itself and the one before.
	var total, regs int64
	for i, s := range perSec {
		total += s.opened
		regs += s.regs
		window := s.regs
		if i > 0 {
			window += perSec[i-1].regs
		}
		allowed := 2 * replication * (window + 50)
		if i == 0 {
			allowed += 2 * replication * instances // warm-up of the initial pools
		}
		if s.opened > allowed {
			t.Errorf("second %d: %d connections opened for %d registrations in it and the second before, want ≤ %d (2 × replication %d × (registrations + 50))",
				i, s.opened, window, allowed, replication)
		}
	}
	st := g.Stats()
	t.Logf("connections: %d opened over %d registrations (%.2f per registration; replication %d; without subsetting up to %d); %d open now; shed %d; retries %d",
		total, regs, float64(total)/float64(max(regs, 1)), replication, cfg.Shards, st.ConnectionsOpen, st.Shed, st.Retries)
	if st.Shed != 0 {
		t.Errorf("%d requests shed during churn", st.Shed)
	}
}

// tableView reads /routes from the admin port.
func tableView(t *testing.T, g *gateway.Gateway) gateway.TableView {
	t.Helper()
	resp, err := httpClient(t).Get("http://" + g.AdminAddr() + "/routes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v gateway.TableView
	if err := jsonDecode(resp.Body, &v); err != nil {
		t.Fatal(err)
	}
	return v
}
