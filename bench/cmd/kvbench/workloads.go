package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

// opKind is what every client of a workload does, op after op.
type opKind int

const (
	// opPut puts to the client's own sequence of fresh keys.
	opPut opKind = iota
	// opGet reads one preloaded key, linearizably (etcd's default Range).
	opGet
	// opStale reads one preloaded key from the member asked, without
	// confirming leadership: Lodestone's STALE, etcd's serializable.
	opStale
	// opRange reads rangeSize consecutive preloaded keys, linearizably.
	opRange
	// opMix is opGet nine times in ten and otherwise a put overwriting a
	// preloaded key with a value of the same size.
	opMix
)

// workload is one measured load and its BENCH verdict.
type workload struct {
	group   string // the -workloads name that selects it
	name    string // the BENCH name stem, e.g. "get-64clients"
	kind    opKind
	clients int
	// conns is how many gRPC connections the clients share; 0 means one
	// per -clients-per-conn clients.
	conns int
	// valueSize is the bytes of every value a put writes; 0 means
	// -value-size.
	valueSize int
	// tput and p99 are the targets of the throughput and p99 ratios.
	tput, p99 float64
}

// groups lists the -workloads names in the order a repetition runs them.
var groups = []string{"put", "put64k", "get", "stale", "range", "mix", "clients1000"}

// readWorkloads run, in this order, on one preloaded cluster per system
// and repetition. The targets marked "issue" come from issue 40; the rest
// ask for at least etcd's figure.
var readWorkloads = []workload{
	{group: "get", name: "get-1clients", kind: opGet, clients: 1, tput: 1.0, p99: 1.0},
	{group: "get", name: "get-64clients", kind: opGet, clients: 64, tput: 2.0, p99: 1.0},                              // issue
	{group: "stale", name: "get-stale-64clients", kind: opStale, clients: 64, tput: 1.5, p99: 1.0},                    // issue: throughput
	{group: "range", name: "range100-64clients", kind: opRange, clients: 64, tput: 1.0, p99: 1.0},                     //
	{group: "mix", name: "mix90get-64clients", kind: opMix, clients: 64, tput: 1.5, p99: 1.0},                         // issue: throughput
	{group: "clients1000", name: "mix90get-1000clients", kind: opMix, clients: 1000, conns: 100, tput: 1.5, p99: 1.0}, // issue
}

// bigPutWorkload runs on a fresh cluster of its own, as the puts do.
var bigPutWorkload = workload{group: "put64k", name: "put64kib-64clients", kind: opPut, clients: 64, valueSize: 64 << 10, tput: 1.0, p99: 1.0} // issue: throughput

// putWorkload is the original put workload at n clients.
func putWorkload(n int) workload {
	tput, p99 := targets(n)
	return workload{group: "put", name: fmt.Sprintf("put-%dclients", n), kind: opPut, clients: n, tput: tput, p99: p99}
}

// parseWorkloads reads -workloads: "all" or a comma-separated list of
// groups. The answer is a set.
func parseWorkloads(s string) (map[string]bool, error) {
	sel := map[string]bool{}
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "all":
			for _, g := range groups {
				sel[g] = true
			}
		case slices.Contains(groups, f):
			sel[f] = true
		default:
			return nil, fmt.Errorf("unknown workload %q (want all or a comma-separated list of %s)", f, strings.Join(groups, ", "))
		}
	}
	return sel, nil
}

// connections is how many connections w's clients share.
func (w workload) connections(perConn int) int {
	if w.conns > 0 {
		return w.conns
	}
	return (w.clients + perConn - 1) / perConn
}

// preloaded says whether w reads (or overwrites) the preloaded keys.
func (w workload) preloaded() bool { return w.kind != opPut }

// describe says in one line what w's clients do, for the output.
func (w workload) describe(perConn, valueSize int) string {
	what := map[opKind]string{
		opPut:   fmt.Sprintf("puts of %d-byte values to distinct keys (kvbench/<client>/<seq>)", cmp.Or(w.valueSize, valueSize)),
		opGet:   "linearizable gets of one preloaded key each (Lodestone: Get, consistency LINEARIZABLE; etcd: Range, serializable=false)",
		opStale: "gets of one preloaded key each that skip the leadership check (Lodestone: Get, consistency STALE; etcd: Range, serializable=true)",
		opRange: fmt.Sprintf("linearizable reads of %d consecutive preloaded keys with values (Lodestone: Range by prefix; etcd: Range [key, range_end)), limit %d", rangeSize, rangeSize),
		opMix:   fmt.Sprintf("90 %% linearizable gets of a preloaded key, 10 %% puts overwriting one with a %d-byte value; throughput and p99 over both", valueSize),
	}[w.kind]
	return fmt.Sprintf("workload %s: %d clients over %d connections to the leader, %s", w.name, w.clients, w.connections(perConn), what)
}

// lines are w's two verdicts from each side's samples: the medians of
// throughput and of p99.
func (w workload) lines(lode, peer []sample) []harness.Line {
	th := func(s sample) float64 { return s.throughput }
	lat := func(s sample) float64 { return s.p99 }
	return []harness.Line{
		{Name: w.name + "-throughput", Unit: "ops/s", Lodestone: medianOf(lode, th), PeerName: peerName, Peer: medianOf(peer, th), Op: ">=", Target: w.tput},
		{Name: w.name + "-p99", Unit: "ms", Lodestone: medianOf(lode, lat), PeerName: peerName, Peer: medianOf(peer, lat), Op: "<=", Target: w.p99},
	}
}

func medianOf(ss []sample, f func(sample) float64) float64 {
	var xs []float64
	for _, s := range ss {
		xs = append(xs, f(s))
	}
	return harness.Median(xs)
}

// The preloaded keys: preloadKeys of them, kvbench/pre/00000 to
// kvbench/pre/09999, so that the prefix kvbench/pre/NNN selects exactly
// the rangeSize keys of block NNN.
const (
	preloadKeys = 10000
	rangeSize   = 100
	// preloadBatch is the puts per preload transaction, under both
	// systems' default limits (Lodestone 64 operations, etcd 128).
	preloadBatch = 50
)

func preloadKey(i int) []byte { return fmt.Appendf(nil, "kvbench/pre/%05d", i) }

// rangePrefix selects the keys of block b (0 <= b < preloadKeys/rangeSize).
func rangePrefix(b int) []byte { return fmt.Appendf(nil, "kvbench/pre/%03d", b) }

// draw is the pseudo-random number behind a client's seq-th op: a
// function of both alone (splitmix64's finalizer), so both systems see the
// same keys in the same order and no client waits on a shared generator.
func draw(client, seq int) uint64 {
	z := uint64(client)<<32 ^ uint64(seq) + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// mixPuts says whether draw h is one of the mix's puts (one in ten). It
// uses bits that the key choice (h mod preloadKeys) barely depends on.
func mixPuts(h uint64) bool { return (h>>40)%10 == 0 }

// classes splits a mix's latencies into its gets (class 0) and its puts
// (class 1), so a run line can say which of them makes the tail; other
// workloads have one kind of op and no classes.
func (w workload) classes() (n int, class func(client, seq int) int) {
	if w.kind != opMix {
		return 0, nil
	}
	return 2, func(client, seq int) int {
		if mixPuts(draw(client, seq)) {
			return 1
		}
		return 0
	}
}

// errWrongAnswer marks a read that answered, but not what was preloaded:
// it counts as a failed op, never as a fast one.
var errWrongAnswer = errors.New("wrong answer")

// connOps is one connection's operations on a system.
type connOps struct {
	put func(ctx context.Context, key, value []byte) error
	// putBatch puts value under every key in one transaction.
	putBatch func(ctx context.Context, keys [][]byte, value []byte) error
	// get returns the key's value and whether the key exists.
	get func(ctx context.Context, key []byte, stale bool) (value []byte, found bool, err error)
	// rangeKeys returns how many keys starting with prefix it read (at
	// most limit).
	rangeKeys func(ctx context.Context, prefix []byte, limit int) (int, error)
	// close releases what the operations hold beside the connection.
	close func()
}

// op is w's operation for harness.Drive: client c uses connection c mod
// len(conns); values[c] is the value it puts; a read must find values of
// readSize bytes.
func (w workload) op(conns []connOps, values [][]byte, readSize int) harness.Op {
	get := func(ctx context.Context, c connOps, key []byte, stale bool) error {
		v, found, err := c.get(ctx, key, stale)
		switch {
		case err != nil:
			return err
		case !found:
			return fmt.Errorf("%w: get %s: no such key", errWrongAnswer, key)
		case len(v) != readSize:
			return fmt.Errorf("%w: get %s: value of %d bytes, want %d", errWrongAnswer, key, len(v), readSize)
		}
		return nil
	}
	return func(ctx context.Context, client, seq int) error {
		c := conns[client%len(conns)]
		h := draw(client, seq)
		switch w.kind {
		case opGet, opStale:
			return get(ctx, c, preloadKey(int(h%preloadKeys)), w.kind == opStale)
		case opRange:
			prefix := rangePrefix(int(h % (preloadKeys / rangeSize)))
			n, err := c.rangeKeys(ctx, prefix, rangeSize)
			if err == nil && n != rangeSize {
				err = fmt.Errorf("%w: range %s: %d keys, want %d", errWrongAnswer, prefix, n, rangeSize)
			}
			return err
		case opMix:
			key := preloadKey(int(h % preloadKeys))
			if mixPuts(h) {
				return c.put(ctx, key, values[client])
			}
			return get(ctx, c, key, false)
		default:
			return c.put(ctx, fmt.Appendf(nil, "kvbench/%03d/%09d", client, seq), values[client])
		}
	}
}
