package gateway

import (
	"hash/fnv"
	"math/bits"
	"slices"
)

// Deterministic subsetting on a binary Van der Corput ring (Netflix, "Curbing
// Connection Churn in Zuul"; Google's Ringsteady).
//
// Every instance of a service holds a sequence number seq; its position on
// the ring [0, 1) is vdc(seq), seq's bits mirrored behind the binary point
// (0, 1/2, 1/4, 3/4, 1/8, 5/8, ...). The ring is cut into S = 2^k equal
// slices, one per subset, and shard i uses subset i mod S, so every subset
// is shared by Shards/S shards (the replication) and every origin is held
// by exactly that many pools.
//
// Because S is a power of two, the subset of seq is just its low k bits
// mirrored: any 2^k consecutive seqs land one in each subset, so n
// instances with seqs 0..n-1 fill the subsets within one of each other.
//
// NB: Zuul gives every new instance the next seq, which keeps the ring
// balanced only while instances are added in order; under churn the live
// seqs scatter and so do subset sizes. We hand out the *lowest free* seq
// instead: a new instance takes the slot of the last one removed, in the
// same subset, so the live seqs stay (nearly) 0..n-1 and the subsets
// balanced however long the churn runs. Each add or remove still touches
// exactly one subset.

// subsetOf returns the subset (0..2^k-1) of seq when the ring is cut into
// 2^k slices: floor(vdc(seq) × 2^k).
func subsetOf(seq uint32, k int) int {
	if k == 0 {
		return 0
	}
	return int(bits.Reverse32(seq) >> (32 - k))
}

// vdc returns seq's position on the ring, for display.
func vdc(seq uint32) float64 {
	return float64(bits.Reverse32(seq)) / (1 << 32)
}

// subsetBits picks k (2^k subsets) for a service of n instances: the
// largest k ≤ maxBits whose subsets hold at least size instances. prev is
// the service's current k; it is kept while its subsets stay within 10% of
// the [size, 2×size) band, so a service hovering at a boundary does not
// reshuffle every subset on each flap (a change of k moves most origins).
func subsetBits(n, prev, maxBits, size int) int {
	if size < 1 {
		size = 1
	}
	want := 0
	for want < maxBits && n >= size<<(want+1) {
		want++
	}
	if prev == want || prev < 0 || prev > maxBits {
		return want
	}
	// Keep prev while n/2^prev ∈ [0.9×size, 2.2×size) (no upper bound at
	// maxBits, no lower bound at 0 subsets to split).
	lowOK := prev == 0 || n*10 >= (size*9)<<prev
	highOK := prev == maxBits || n*10 < (size*22)<<prev
	if lowOK && highOK {
		return prev
	}
	return want
}

// maxSubsetBits returns log2(shards/replication), the most subsets a
// service may be cut into so each is still shared by replication shards.
func maxSubsetBits(shards, replication int) int {
	if replication < 1 {
		replication = 1
	}
	k := 0
	for (replication << (k + 1)) <= shards {
		k++
	}
	return k
}

// seqAlloc hands out sequence numbers, lowest free first. The zero value
// is empty. It is a value type: copy-on-write through clone.
type seqAlloc struct {
	next uint32   // every seq ≥ next is free
	free []uint32 // free seqs below next, ascending
}

func (a seqAlloc) clone() seqAlloc {
	return seqAlloc{next: a.next, free: slices.Clone(a.free)}
}

// take returns the lowest free seq.
func (a *seqAlloc) take() uint32 {
	if len(a.free) > 0 {
		s := a.free[0]
		a.free = a.free[1:]
		return s
	}
	s := a.next
	a.next++
	return s
}

// put frees seq.
func (a *seqAlloc) put(seq uint32) {
	if seq+1 == a.next {
		a.next--
		// Keep the invariant free < next: trailing free seqs fold into next.
		for len(a.free) > 0 && a.free[len(a.free)-1]+1 == a.next {
			a.free = a.free[:len(a.free)-1]
			a.next--
		}
		return
	}
	i, found := slices.BinarySearch(a.free, seq)
	if found {
		panic("gateway: seqAlloc.put of a free seq")
	}
	a.free = slices.Insert(a.free, i, seq)
}

// shuffleKey orders a bulk load of instances onto the ring: a hash of the
// gateway's seed and the instance id, so each gateway fills its subsets in
// its own order but always the same order for the same seed.
func shuffleKey(seed uint64, id string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(seed >> (8 * i))
	}
	h.Write(b[:])
	h.Write([]byte(id))
	return h.Sum64()
}
