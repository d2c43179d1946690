package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/server"
)

func TestParseWorkloads(t *testing.T) {
	all, err := parseWorkloads("all")
	if err != nil || len(all) != len(groups) {
		t.Fatalf("parseWorkloads(all) = %v, %v; want every group", all, err)
	}
	got, err := parseWorkloads("get, mix")
	if want := map[string]bool{"get": true, "mix": true}; err != nil || !maps.Equal(got, want) {
		t.Errorf("parseWorkloads(\"get, mix\") = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"", "gets", "get,,mix"} {
		_, err := parseWorkloads(bad)
		if err == nil || !strings.Contains(err.Error(), "clients1000") {
			t.Errorf("parseWorkloads(%q) = %v; want an error listing the groups", bad, err)
		}
	}
}

// Every range prefix selects exactly rangeSize preloaded keys, and every
// preloaded key lies in exactly one block.
func TestRangePrefixSelectsOneBlock(t *testing.T) {
	keys := make([][]byte, preloadKeys)
	for i := range keys {
		keys[i] = preloadKey(i)
	}
	seen := make([]int, preloadKeys)
	for b := range preloadKeys / rangeSize {
		p := rangePrefix(b)
		n := 0
		for i, k := range keys {
			if bytes.HasPrefix(k, p) {
				n++
				seen[i]++
			}
		}
		if n != rangeSize {
			t.Fatalf("prefix %s selects %d preloaded keys, want %d", p, n, rangeSize)
		}
	}
	for i, n := range seen {
		if n != 1 {
			t.Fatalf("key %s lies in %d blocks, want 1", preloadKey(i), n)
		}
	}
}

// draw is the same for the same client and seq, reaches every key and
// every range block, and makes about one op in ten a put.
func TestDrawSpreadsKeysAndPuts(t *testing.T) {
	if draw(3, 7) != draw(3, 7) || draw(3, 7) == draw(7, 3) || draw(0, 1) == draw(1, 0) {
		t.Fatal("draw is not a function of (client, seq) alone, or mixes them up")
	}
	keys, blocks := map[uint64]bool{}, map[uint64]bool{}
	puts, n := 0, 0
	for c := range 64 {
		for s := range 5000 {
			h := draw(c, s)
			keys[h%preloadKeys], blocks[h%(preloadKeys/rangeSize)] = true, true
			if mixPuts(h) {
				puts++
			}
			n++
		}
	}
	if len(keys) != preloadKeys || len(blocks) != preloadKeys/rangeSize {
		t.Errorf("%d draws reached %d keys and %d blocks, want all %d and %d", n, len(keys), len(blocks), preloadKeys, preloadKeys/rangeSize)
	}
	if share := float64(puts) / float64(n); share < 0.095 || share > 0.105 {
		t.Errorf("mix put share %.4f, want 0.10 +- 0.005", share)
	}
}

func TestPlan(t *testing.T) {
	plain := []system{{name: "lodestone"}, {name: "etcd"}}
	secured := []system{{name: "lodestone-secure"}, {name: "etcd-secure"}}
	shape := func(ps []phase) string {
		var parts []string
		for _, p := range ps {
			var ss, ws []string
			for _, s := range p.systems {
				ss = append(ss, s.name)
			}
			for _, w := range p.workloads {
				ws = append(ws, w.name)
			}
			parts = append(parts, fmt.Sprintf("[%s: %s]", strings.Join(ss, ","), strings.Join(ws, ",")))
		}
		return strings.Join(parts, " ")
	}
	all, _ := parseWorkloads("all")
	for _, tc := range []struct {
		name     string
		selected map[string]bool
		secured  []system
		want     string
	}{
		{"all", all, secured,
			"[lodestone,etcd: put-1clients] [lodestone,etcd,lodestone-secure,etcd-secure: put-64clients] " +
				"[lodestone,etcd: put64kib-64clients] " +
				"[lodestone,etcd: get-1clients,get-64clients,get-stale-64clients,range100-64clients,mix90get-64clients,mix90get-1000clients]"},
		{"reads only, in the table's order", map[string]bool{"mix": true, "get": true}, nil,
			"[lodestone,etcd: get-1clients,get-64clients,mix90get-64clients]"},
		{"64 KiB puts only", map[string]bool{"put64k": true}, nil, "[lodestone,etcd: put64kib-64clients]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := shape(plan(tc.selected, []int{1, 64}, plain, tc.secured)); got != tc.want {
				t.Errorf("plan:\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}

// TestWorkloadLines pins the BENCH lines' shape: medians of each side's
// samples, the workload's own targets.
func TestWorkloadLines(t *testing.T) {
	w := readWorkloads[slices.IndexFunc(readWorkloads, func(w workload) bool { return w.name == "get-64clients" })]
	lode := []sample{{30000, 4}, {20000, 6}, {25000, 5}}
	peer := []sample{{10000, 9}, {12500, 10}, {11000, 8}}
	var got []string
	for _, l := range w.lines(lode, peer) {
		got = append(got, l.String())
	}
	want := []string{
		"BENCH get-64clients-throughput lodestone=25000ops/s etcd=11000ops/s ratio=2.27 target=>=2.0",
		"BENCH get-64clients-p99 lodestone=5ms etcd=9ms ratio=0.56 target=<=1.0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("lines:\n got: %q\nwant: %q", got, want)
	}
}

// TestOpsOnRealServers runs each system's operations and every workload's
// op against one real member of each system: reads of keys that are not
// there are wrong answers, the preload makes every read right, and the
// mix's puts land where its draws say.
func TestOpsOnRealServers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) *cluster
	}{
		{"lodestone", startLodestone},
		{"etcd", startEtcd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.start(t)
			ctx := t.Context()
			var err error
			if c.leader, err = c.waitLeader(ctx, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			checkOps(t, c)
		})
	}
}

func checkOps(t *testing.T, c *cluster) {
	ctx := t.Context()
	ops, err := c.sys.ops(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer ops.close()
	conns := []connOps{ops}
	const size = 32
	values := [][]byte{bytes.Repeat([]byte("m"), size), bytes.Repeat([]byte("n"), size)}

	for _, k := range []opKind{opGet, opStale, opRange} {
		if err := (workload{kind: k}).op(conns, values, size)(ctx, 0, 0); !errors.Is(err, errWrongAnswer) {
			t.Errorf("kind %d before the preload: %v, want a wrong answer", k, err)
		}
	}
	if err := c.preload(ctx, size); err != nil {
		t.Fatal(err)
	}
	for _, k := range []opKind{opGet, opStale, opRange} {
		op := (workload{kind: k}).op(conns, values, size)
		for client := range 2 {
			for seq := range 50 {
				if err := op(ctx, client, seq); err != nil {
					t.Fatalf("kind %d, client %d, op %d: %v", k, client, seq, err)
				}
			}
		}
	}

	mix := (workload{kind: opMix}).op(conns, values, size)
	last := map[int]int{} // key index -> the client that put it last
	for client := range 2 {
		for seq := range 100 {
			if err := mix(ctx, client, seq); err != nil {
				t.Fatalf("mix, client %d, op %d: %v", client, seq, err)
			}
			if h := draw(client, seq); mixPuts(h) {
				last[int(h%preloadKeys)] = client
			}
		}
	}
	if len(last) == 0 {
		t.Fatal("200 mix ops drew no put")
	}
	n, class := (workload{kind: opMix}).classes()
	for client := range 2 {
		for seq := range 100 {
			if put := mixPuts(draw(client, seq)); n != 2 || (class(client, seq) == 1) != put {
				t.Fatalf("mix op (%d, %d): class %d of %d, put %v", client, seq, class(client, seq), n, put)
			}
		}
	}
	for i, client := range last {
		v, _, err := conns[0].get(ctx, preloadKey(i), false)
		if err != nil || !bytes.Equal(v, values[client]) {
			t.Errorf("after the mix, %s = %q, %v; want client %d's value", preloadKey(i), v, err, client)
		}
	}

	big := [][]byte{bytes.Repeat([]byte("b"), bigPutWorkload.valueSize)}
	if err := bigPutWorkload.op(conns, big, size)(ctx, 0, 0); err != nil {
		t.Fatalf("64 KiB put: %v", err)
	}
	if v, _, err := conns[0].get(ctx, []byte("kvbench/000/000000000"), false); err != nil || !bytes.Equal(v, big[0]) {
		t.Errorf("64 KiB put read back as %d bytes, %v", len(v), err)
	}
}

func freeAddrs(t *testing.T, n int) []string {
	ports, err := harness.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, p := range ports {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", p))
	}
	return addrs
}

// startLodestone runs one Lodestone member in this process.
func startLodestone(t *testing.T) *cluster {
	a := freeAddrs(t, 3)
	cfg := server.DefaultConfig()
	cfg.Name, cfg.DataDir = "n1", t.TempDir()
	cfg.ListenPeer, cfg.ListenGRPC, cfg.ListenHTTP = a[0], a[1], a[2]
	cfg.InitialCluster = map[string]string{"n1": a[0]}
	cfg.TickInterval, cfg.ElectionTicks = 20*time.Millisecond, 10
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close lodestone: %v", err)
		}
	})
	return &cluster{sys: lodestoneSystem("", nil), clients: []string{a[1]}}
}

// startEtcd runs one etcd member in this process, without fsync: the test
// checks answers, not speed.
func startEtcd(t *testing.T) *cluster {
	a := freeAddrs(t, 2)
	peer, client := url.URL{Scheme: "http", Host: a[0]}, url.URL{Scheme: "http", Host: a[1]}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "n1", t.TempDir()
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.InitialCluster = "n1=" + peer.String()
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(20 * time.Second):
		t.Fatal("etcd not ready within 20s")
	}
	return &cluster{sys: etcdSystem("", nil), clients: []string{a[1]}}
}
