package gateway

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSubsetOfIsVanDerCorput: the bit trick equals cutting the ring at the
// binary Van der Corput position.
func TestSubsetOfIsVanDerCorput(t *testing.T) {
	for seq := uint32(0); seq < 5000; seq++ {
		for k := 0; k <= 10; k++ {
			if got, want := subsetOf(seq, k), int(math.Floor(vdc(seq)*float64(int(1)<<k))); got != want {
				t.Fatalf("subsetOf(%d, %d) = %d, want floor(vdc×2^k) = %d", seq, k, got, want)
			}
		}
	}
	// The first positions are the sequence Netflix shows.
	var got []float64
	for seq := uint32(0); seq < 8; seq++ {
		got = append(got, vdc(seq))
	}
	if want := []float64{0, 0.5, 0.25, 0.75, 0.125, 0.625, 0.375, 0.875}; !slices.Equal(got, want) {
		t.Errorf("vdc(0..7) = %v, want %v", got, want)
	}
}

func TestSubsetBits(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		n, prev, maxBits, size int
		want                   int
	}{
		{"empty", 0, -1, 3, 25, 0},
		{"below one subset", 24, -1, 3, 25, 0},
		{"49 is one subset", 49, -1, 3, 25, 0},
		{"50 is two", 50, -1, 3, 25, 1},
		{"200 is eight of 25", 200, -1, 3, 25, 3},
		{"capped by shards/replication", 10000, -1, 3, 25, 3},
		{"hysteresis keeps 1 at 46 (≥ 0.9×25×2)", 46, 1, 3, 25, 1},
		{"hysteresis gives up 1 at 44", 44, 1, 3, 25, 0},
		{"hysteresis keeps 0 at 54 (< 2.2×25)", 54, 0, 3, 25, 0},
		{"hysteresis gives up 0 at 55", 55, 0, 3, 25, 1},
		{"prev above the cap", 200, 5, 3, 25, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := subsetBits(tc.n, tc.prev, tc.maxBits, tc.size); got != tc.want {
				t.Errorf("subsetBits(%d, %d, %d, %d) = %d, want %d", tc.n, tc.prev, tc.maxBits, tc.size, got, tc.want)
			}
		})
	}
}

func TestMaxSubsetBits(t *testing.T) {
	for _, tc := range []struct{ shards, repl, want int }{
		{16, 2, 3}, {16, 1, 4}, {16, 3, 2}, {1, 1, 0}, {8, 8, 0}, {4, 0, 2},
	} {
		if got := maxSubsetBits(tc.shards, tc.repl); got != tc.want {
			t.Errorf("maxSubsetBits(%d, %d) = %d, want %d", tc.shards, tc.repl, got, tc.want)
		}
	}
}

func TestSeqAllocLowestFree(t *testing.T) {
	var a seqAlloc
	for i := range 6 {
		if got := a.take(); got != uint32(i) {
			t.Fatalf("take = %d, want %d", got, i)
		}
	}
	a.put(4)
	a.put(1)
	a.put(5) // folds 4 and 5 into next
	if got, want := a.next, uint32(4); got != want {
		t.Fatalf("next = %d, want %d (trailing free seqs fold)", got, want)
	}
	for _, want := range []uint32{1, 4, 5} {
		if got := a.take(); got != want {
			t.Fatalf("take = %d, want %d", got, want)
		}
	}
}

// ringHarness drives a service through table.apply.
type ringHarness struct {
	t   *testing.T
	env *tableEnv
	tb  *table
	idx uint64
}

func newRingHarness(t *testing.T, shards, size, repl int) *ringHarness {
	env := bareEnv(shards, size, repl, 7)
	return &ringHarness{t: t, env: env, tb: emptyTable(nil, env)}
}

func (h *ringHarness) apply(u Update) *tableDiff {
	h.idx++
	u.Index = h.idx
	nt, d := h.tb.apply(u, h.env)
	checkTable(h.t, nt, h.env)
	h.tb = nt
	return d
}

func (h *ringHarness) add(ids ...string) *tableDiff {
	var u Update
	for _, id := range ids {
		in := Instance{Address: "10.0.0.1", Port: 80, Healthy: true}
		u.Instances = append(u.Instances, InstanceChange{Service: "svc", ID: id, Instance: &in})
	}
	return h.apply(u)
}

func (h *ringHarness) remove(ids ...string) *tableDiff {
	var u Update
	for _, id := range ids {
		u.Instances = append(u.Instances, InstanceChange{Service: "svc", ID: id})
	}
	return h.apply(u)
}

// subsetSizes returns the size of each subset.
func (h *ringHarness) subsetSizes() []int {
	s := h.tb.services["svc"]
	sizes := make([]int, 1<<s.bits)
	for j := range sizes {
		sizes[j] = len(s.shards[j])
	}
	return sizes
}

// TestRingBalance: n origins added one by one fill the subsets within one
// of each other, subsets hold 25..50 origins once there are 50, and every
// origin is held by the same number of shards (checkTable), so
// connections are spread evenly over origins.
func TestRingBalance(t *testing.T) {
	for _, n := range []int{1, 2, 24, 25, 49, 50, 51, 99, 100, 199, 200, 257, 400, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			h := newRingHarness(t, 16, 25, 2)
			for i := range n {
				h.add(fmt.Sprintf("i%d", i))
			}
			sizes := h.subsetSizes()
			if lo, hi := slices.Min(sizes), slices.Max(sizes); hi-lo > 1 {
				t.Errorf("subset sizes %v: spread %d, want ≤ 1", sizes, hi-lo)
			}
			s := h.tb.services["svc"]
			if n >= 55 && len(sizes) < 8 {
				if lo := slices.Min(sizes); lo < 25 || slices.Max(sizes) >= 55 {
					t.Errorf("n=%d: subset sizes %v outside [25, 55)", n, sizes)
				}
			}
			conns := 0
			for _, sh := range s.shards {
				conns += len(sh)
			}
			if got, want := conns, n*(16>>s.bits); got != want {
				t.Errorf("pools = %d, want n × replication = %d", got, want)
			}
		})
	}
}

// TestRingBalanceUnderChurn: a long random churn (removals and additions
// in random batches) leaves the subsets balanced whenever the origin count
// is back, because new origins take the freed slots. Zuul's monotonic
// sequence numbers would let the spread grow.
func TestRingBalanceUnderChurn(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	h := newRingHarness(t, 16, 25, 2)
	live := []string{}
	next := 0
	for range 200 {
		live = append(live, fmt.Sprintf("i%d", next))
		next++
	}
	h.add(live...)
	for round := range 300 {
		k := 1 + rng.IntN(20)
		var gone []string
		for range k {
			i := rng.IntN(len(live))
			gone = append(gone, live[i])
			live = append(live[:i], live[i+1:]...)
		}
		h.remove(gone...)
		var fresh []string
		for range k {
			fresh = append(fresh, fmt.Sprintf("i%d", next))
			next++
		}
		live = append(live, fresh...)
		h.add(fresh...)
		sizes := h.subsetSizes()
		if lo, hi := slices.Min(sizes), slices.Max(sizes); hi-lo > 1 {
			t.Fatalf("seed %d round %d: subset sizes %v: spread %d, want ≤ 1", seed, round, sizes, hi-lo)
		}
	}
}

// TestRingStability: adding or removing one origin changes exactly one
// subset (unless the number of subsets itself changes), and opens or
// closes only that origin's pools in that subset's shards.
func TestRingStability(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	h := newRingHarness(t, 16, 25, 2)
	var live []string
	check := func(d *tableDiff, op string) {
		t.Helper()
		sd := d.services[0]
		if sd.bitsFrom != sd.bitsTo && sd.bitsFrom >= 0 && sd.bitsTo >= 0 {
			return // the cut itself changed: a reshuffle, by design rare (hysteresis)
		}
		if sd.bitsTo < 0 {
			return
		}
		if got := len(sd.subsetsTouched); got != 1 {
			t.Fatalf("seed %d: %s touched subsets %v, want exactly one", seed, op, sd.subsetsTouched)
		}
		repl := 16 >> sd.bitsTo
		opened, closed := 0, 0
		if op == "add" {
			opened = repl
		} else {
			closed = repl
		}
		if sd.poolsOpened != opened || sd.poolsClosed != closed {
			t.Fatalf("seed %d: %s opened %d pools and closed %d, want %d and %d", seed, op, sd.poolsOpened, sd.poolsClosed, opened, closed)
		}
	}
	reshuffles := 0
	for i := range 600 {
		// Grow to ~300 with some removals, then shrink.
		grow := i < 400
		if len(live) == 0 || (grow && rng.IntN(4) != 0) || (!grow && rng.IntN(4) == 0) {
			id := fmt.Sprintf("i%d", i)
			live = append(live, id)
			d := h.add(id)
			if d.services[0].bitsFrom != d.services[0].bitsTo {
				reshuffles++
			}
			check(d, "add")
		} else {
			j := rng.IntN(len(live))
			id := live[j]
			live = append(live[:j], live[j+1:]...)
			d := h.remove(id)
			if d.services[0].bitsFrom != d.services[0].bitsTo {
				reshuffles++
			}
			check(d, "remove")
		}
	}
	// 0→300→~100 origins crosses each cut a few times at most.
	if reshuffles > 12 {
		t.Errorf("the number of subsets changed %d times over 600 single changes; hysteresis should keep it rare", reshuffles)
	}
}
