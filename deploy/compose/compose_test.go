package compose

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// newLeaderWithin is the longest a killed leader may go unreplaced.
const newLeaderWithin = 5 * time.Second

// TestComposeCluster builds the image, brings up the compose cluster
// (make compose-up) and drives it through the published ports only:
// KV over mutual TLS with a token, the demo services passing, the gateway
// answering from both. Then, with writers recording every acknowledged
// write and load through the gateway all along, it kills the leader,
// partitions a server and rolls every server onto a newly built image,
// and checks that no acknowledged write was lost and the gateway kept
// serving.
func TestComposeCluster(t *testing.T) {
	requireDocker(t)
	began := time.Now()
	c := newCluster(t)

	phase := time.Now()
	c.makeImage(t, "v1")
	t.Logf("FIGURE phase=image-v1 duration=%v", since(phase))

	phase = time.Now()
	c.up(t)
	t.Logf("FIGURE phase=compose-up duration=%v", since(phase))

	app := c.secret(t, "app-token")
	clients := make([]*api.Client, len(servers))
	byName := map[string]*api.Client{}
	for i, s := range servers {
		clients[i] = c.consul(t, s, app)
		byName[s] = clients[i]
	}

	phase = time.Now()
	checkAdvertised(t, c)
	checkKV(t, c, byName)
	waitDemoPassing(t, clients[0])
	gatewayURL := "http://127.0.0.1:" + c.gatewayPort + "/"
	waitBothInstances(t, gatewayURL)
	t.Logf("FIGURE phase=first-checks duration=%v", since(phase))

	// The load: writers and the gateway, all along.
	ctx, stop := context.WithCancel(context.Background())
	l := newLedger()
	var writers sync.WaitGroup
	for i := range 3 {
		w := &writer{id: i, clients: clients, l: l}
		writers.Go(func() { w.run(ctx) })
	}
	g := &gatewayLoad{}
	gwDone := g.run(ctx, gatewayURL, 3, 10*time.Millisecond)
	stopLoad := sync.OnceFunc(func() {
		stop()
		writers.Wait()
		gwDone.Wait()
	})
	t.Cleanup(stopLoad)
	loadStart, gwStart := time.Now(), g.count()
	waitAcks(t, l, 50, 30*time.Second)

	killLeader(t, c, byName, l)
	partitionServer(t, c, byName, l)
	rollingRestart(t, c, byName, l, g)

	stopLoad()
	phase = time.Now()
	stored := readAllRetry(t, clients)
	if bad := l.checkFinal(stored); len(bad) > 0 {
		t.Errorf("%d keys do not hold their last acknowledged write, e.g. %s", len(bad), strings.Join(first(bad, 10), "; "))
	}
	t.Logf("FIGURE phase=final-read duration=%v keys=%d", since(phase), len(stored))
	total := g.count().minus(gwStart)
	t.Logf("FIGURE writes acked=%d failed-attempts=%d keys=%d over %v", l.acks.Load(), l.failures.Load(), len(stored), since(loadStart))
	if msg := l.errorSummary(); msg != "" {
		t.Logf("write failures (retried): %s", msg)
	}
	t.Logf("FIGURE gateway whole-run %s served=%v", total, g.served())
	if total.requests == 0 || total.ok == 0 {
		t.Errorf("the gateway load sent %d requests with %d answered 2xx", total.requests, total.ok)
	}
	t.Logf("FIGURE test duration=%v", since(began))
}

// checkAdvertised: every member lists every other at the advertised
// names, not the wildcards they listen on. Members publish their client
// addresses once a leader is known, so this waits for that.
func checkAdvertised(t *testing.T, c *cluster) {
	t.Helper()
	var bad []string
	if !poll(30*time.Second, 500*time.Millisecond, func() bool {
		bad = bad[:0]
		ms := c.members(t, "server1")
		if len(ms) != len(servers) {
			bad = append(bad, fmt.Sprintf("%d members, want %d", len(ms), len(servers)))
		}
		for _, m := range ms {
			want := member{Name: m.Name, PeerAddr: m.Name + ":7401", GRPCAddr: m.Name + ":7400", HTTPAddr: m.Name + ":8500", Role: "voter"}
			if m != want {
				bad = append(bad, fmt.Sprintf("%+v, want %+v", m, want))
			}
		}
		return len(bad) == 0
	}) {
		t.Fatalf("members as server1 lists them: %s", strings.Join(bad, "; "))
	}
}

// checkKV writes and reads a key with the app token over mutual TLS, and
// sees the door shut without one.
func checkKV(t *testing.T, c *cluster, byName map[string]*api.Client) {
	t.Helper()
	value := "hello-" + c.project
	var err error
	if !poll(30*time.Second, 200*time.Millisecond, func() bool {
		_, err = byName["server1"].KV().Put(&api.KVPair{Key: "app/hello", Value: []byte(value)}, nil)
		return err == nil
	}) {
		t.Fatalf("put app/hello with the app token: %v", err)
	}
	for _, s := range servers {
		kv, _, err := byName[s].KV().Get("app/hello", &api.QueryOptions{RequireConsistent: true})
		if err != nil || kv == nil || string(kv.Value) != value {
			t.Fatalf("get app/hello from %s: %v %+v, want %q", s, err, kv, value)
		}
	}
	anon := c.consul(t, "server2", "")
	if _, err := anon.KV().Put(&api.KVPair{Key: "app/anon", Value: []byte("x")}, nil); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("put without a token: %v, want 403 (ACLs default deny)", err)
	}
}

func waitDemoPassing(t *testing.T, cl *api.Client) {
	t.Helper()
	var got []string
	if !poll(60*time.Second, 500*time.Millisecond, func() bool {
		entries, _, err := cl.Health().Service("demo", "", true, nil)
		got = got[:0]
		if err != nil {
			got = append(got, err.Error())
			return false
		}
		for _, e := range entries {
			got = append(got, e.Node.Node+"="+e.Checks.AggregatedStatus())
		}
		return len(entries) == 2
	}) {
		t.Fatalf("demo instances passing: %v, want agent1 and agent2", got)
	}
	t.Logf("demo passing on %v", got)
}

// waitBothInstances: the gateway answers from demo1 and demo2.
func waitBothInstances(t *testing.T, url string) {
	t.Helper()
	seen := map[string]int{}
	hc := &http.Client{Timeout: 2 * time.Second}
	var last string
	if !poll(60*time.Second, 20*time.Millisecond, func() bool {
		resp, err := hc.Get(url)
		if err != nil {
			last = err.Error()
			return false
		}
		var body [4096]byte
		n, _ := resp.Body.Read(body[:])
		resp.Body.Close()
		last = fmt.Sprintf("%d %s", resp.StatusCode, body[:n])
		if resp.StatusCode == http.StatusOK {
			seen[demoInstance(body[:n])]++
		}
		return seen["demo1"] > 0 && seen["demo2"] > 0
	}) {
		t.Fatalf("through the gateway: answers from %v, last %q; want demo1 and demo2", seen, last)
	}
	t.Logf("gateway answered from %v", seen)
}

func demoInstance(body []byte) string {
	var v struct {
		Instance string `json:"instance"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	return v.Instance
}

// killLeader: docker kill of the leader; a new one within 5 s, no
// acknowledged write lost; restarted, it catches up.
func killLeader(t *testing.T, c *cluster, byName map[string]*api.Client, l *ledger) {
	phase := time.Now()
	lead := waitLeader(t, byName, servers, 30*time.Second)
	id := c.container(t, lead)
	acks := l.acks.Load()
	killed := time.Now()
	c.must(t, time.Minute, "docker", "kill", id)
	rest := without(servers, lead)
	var next string
	if !poll(15*time.Second, 25*time.Millisecond, func() bool {
		next = agreedLeader(byName, rest)
		return next != "" && next != lead
	}) {
		t.Fatalf("no new leader among %v within 15s of killing %s", rest, lead)
	}
	took := time.Since(killed)
	t.Logf("FIGURE kill-leader killed=%s new-leader=%s after=%v", lead, next, took.Round(time.Millisecond))
	if took > newLeaderWithin {
		t.Errorf("a new leader took %v after the leader was killed, want at most %v", took, newLeaderWithin)
	}
	waitAcks(t, l, acks+40, 30*time.Second)
	checkNoLoss(t, "after the leader was killed", l, byName, rest)

	c.must(t, time.Minute, "docker", "start", id)
	c.waitHealthy(t, lead, time.Minute)
	waitCaughtUp(t, lead, byName[lead], l, 30*time.Second)
	t.Logf("FIGURE phase=kill-leader duration=%v acked=%d", since(phase), l.acks.Load()-acks)
}

// partitionServer cuts the leader off the compose network while writes
// go on through the majority, then reconnects it at its address and name;
// its stale read then shows the latest acknowledged write.
func partitionServer(t *testing.T, c *cluster, byName map[string]*api.Client, l *ledger) {
	phase := time.Now()
	cut := waitLeader(t, byName, servers, 30*time.Second)
	id := c.container(t, cut)
	acks := l.acks.Load()
	c.must(t, time.Minute, "docker", "network", "disconnect", c.network(), id)
	reconnected := false
	defer func() {
		if !reconnected { // NB: so the teardown's diagnostics see a whole cluster
			c.run(time.Minute, "docker", "network", "connect", "--ip", c.serverIP(cut), "--alias", cut, c.network(), id)
		}
	}()
	rest := without(servers, cut)
	var next string
	if !poll(15*time.Second, 50*time.Millisecond, func() bool {
		next = agreedLeader(byName, rest)
		return next != "" && next != cut
	}) {
		t.Fatalf("the majority %v elected no leader within 15s of cutting off %s", rest, cut)
	}
	// Writes go on through the majority.
	waitAcks(t, l, l.acks.Load()+60, 30*time.Second)
	during := l.acks.Load() - acks
	checkNoLoss(t, "while "+cut+" was cut off", l, byName, rest)

	c.must(t, time.Minute, "docker", "network", "connect", "--ip", c.serverIP(cut), "--alias", cut, c.network(), id)
	reconnected = true
	waitCaughtUp(t, cut, byName[cut], l, 30*time.Second)
	t.Logf("FIGURE phase=partition cut-off=%s new-leader=%s acked-while-cut=%d duration=%v", cut, next, during, since(phase))
}

// rollingRestart builds a new image (another version) and recreates each
// server on it, followers first, each healthy and caught up before the
// next, counting the gateway's 5xx meanwhile.
func rollingRestart(t *testing.T, c *cluster, byName map[string]*api.Client, l *ledger, g *gatewayLoad) {
	phase := time.Now()
	c.makeImage(t, "v2")
	t.Logf("FIGURE phase=image-v2 duration=%v", since(phase))
	newID := strings.TrimSpace(c.must(t, time.Minute, "docker", "image", "inspect", "-f", "{{.Id}}", c.repo+":v2"))

	lead := waitLeader(t, byName, servers, 30*time.Second)
	order := append(without(servers, lead), lead)
	c.image = c.repo + ":v2"
	phase = time.Now()
	acks, before := l.acks.Load(), g.count()
	for _, s := range order {
		step := time.Now()
		c.compose(t, 2*time.Minute, "up", "-d", "--no-deps", "--no-build", s)
		c.waitHealthy(t, s, time.Minute)
		img := strings.TrimSpace(c.must(t, time.Minute, "docker", "inspect", "-f", "{{.Image}}", c.container(t, s)))
		if img != newID {
			t.Fatalf("%s runs image %s after its restart, want %s (%s:v2)", s, img, newID, c.repo)
		}
		waitCaughtUp(t, s, byName[s], l, 30*time.Second)
		waitLeader(t, byName, servers, 30*time.Second)
		t.Logf("FIGURE rolled=%s in %v", s, since(step))
	}
	window := g.count().minus(before)
	t.Logf("FIGURE phase=rolling-restart duration=%v acked=%d gateway %s", since(phase), l.acks.Load()-acks, window)
	if window.requests < 100 {
		t.Errorf("only %d gateway requests during the rolling restart; the load did not run", window.requests)
	} else if window.status5xx*1000 > window.requests {
		t.Errorf("gateway answered 5xx to %d of %d requests during the rolling restart (over 0.1%%); last: %v",
			window.status5xx, window.requests, g.lastErr.Load())
	}
	checkNoLoss(t, "after the rolling restart", l, byName, servers)
}

// leaderOf asks one server whom it follows; "" when it knows no leader.
func leaderOf(cl *api.Client) string {
	addr, err := cl.Status().Leader()
	if err != nil {
		return ""
	}
	name, _, _ := strings.Cut(addr, ":")
	return name
}

// agreedLeader is the leader every server in names reports, or "".
func agreedLeader(byName map[string]*api.Client, names []string) string {
	var lead string
	for _, n := range names {
		l := leaderOf(byName[n])
		if l == "" || (lead != "" && l != lead) {
			return ""
		}
		lead = l
	}
	return lead
}

func waitLeader(t *testing.T, byName map[string]*api.Client, names []string, within time.Duration) string {
	t.Helper()
	var lead string
	if !poll(within, 100*time.Millisecond, func() bool { lead = agreedLeader(byName, names); return lead != "" }) {
		t.Fatalf("%v agreed on no leader within %v", names, within)
	}
	return lead
}

func waitAcks(t *testing.T, l *ledger, n int64, within time.Duration) {
	t.Helper()
	if !poll(within, 50*time.Millisecond, func() bool { return l.acks.Load() >= n }) {
		t.Fatalf("writes acknowledged: %d, not %d within %v; failures: %s", l.acks.Load(), n, within, l.errorSummary())
	}
}

// waitCaughtUp waits until a server's stale read (its own state) shows
// the latest acknowledged write as of the call.
func waitCaughtUp(t *testing.T, name string, cl *api.Client, l *ledger, within time.Duration) {
	t.Helper()
	key, seq := l.last()
	start := time.Now()
	var got string
	if !poll(within, 100*time.Millisecond, func() bool {
		kv, _, err := cl.KV().Get(key, &api.QueryOptions{AllowStale: true})
		switch {
		case err != nil:
			got = err.Error()
		case kv == nil:
			got = "missing"
		default:
			got = string(kv.Value)
			n, _ := strconv.Atoi(got)
			return n >= seq
		}
		return false
	}) {
		t.Fatalf("%s's stale read of %s: %s, want at least the acknowledged %d within %v", name, key, got, seq, within)
	}
	t.Logf("%s caught up with %s=%d in %v", name, key, seq, since(start))
}

// checkNoLoss reads every key (consistent) through one of names and
// compares with what was acknowledged before the read.
func checkNoLoss(t *testing.T, when string, l *ledger, byName map[string]*api.Client, names []string) {
	t.Helper()
	acked := l.snapshot()
	cls := make([]*api.Client, len(names))
	for i, n := range names {
		cls[i] = byName[n]
	}
	stored := readAllRetry(t, cls)
	if bad := checkNotBehind(acked, stored); len(bad) > 0 {
		t.Fatalf("%s: %d acknowledged writes lost, e.g. %s", when, len(bad), strings.Join(first(bad, 10), "; "))
	}
	t.Logf("%s: all %d acknowledged keys read back", when, len(acked))
}

func readAllRetry(t *testing.T, cls []*api.Client) map[string]int {
	t.Helper()
	var stored map[string]int
	var err error
	i := 0
	if !poll(30*time.Second, 200*time.Millisecond, func() bool {
		stored, err = readAll(cls[i%len(cls)])
		i++
		return err == nil
	}) {
		t.Fatalf("read %s back: %v", loadPrefix, err)
	}
	return stored
}

func without(names []string, drop string) []string {
	var out []string
	for _, n := range names {
		if n != drop {
			out = append(out, n)
		}
	}
	return out
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }
