package main

import "testing"

func TestValueRoundTrip(t *testing.T) {
	for _, seq := range []int{0, 1, 999, 1 << 40} {
		ph, got, ok := decodeValue(encodeValue(7, seq))
		if !ok || ph != 7 || got != seq {
			t.Errorf("decode(encode(7, %d)) = %d, %d, %v", seq, ph, got, ok)
		}
	}
	if _, _, ok := decodeValue([]byte("ok")); ok {
		t.Error("the probe value decoded as a phase write")
	}
}

// keyOf must write every key once per nkeys consecutive writes, so each
// exact watcher is due the same number of events.
func TestKeyOfIsAPermutation(t *testing.T) {
	const n = 10000
	seen := make([]bool, n)
	for seq := range n {
		k := keyOf(seq+3*n, n)
		if seen[k] {
			t.Fatalf("key %d written twice within %d writes", k, n)
		}
		seen[k] = true
	}
}
