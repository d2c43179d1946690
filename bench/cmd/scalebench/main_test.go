package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestValueOf(t *testing.T) {
	for _, size := range []int{1, 7, 8, 256, 1001} {
		a, b := valueOf(41, size), valueOf(41, size)
		if len(a) != size {
			t.Errorf("valueOf(41, %d) has %d bytes", size, len(a))
		}
		if !bytes.Equal(a, b) {
			t.Errorf("valueOf(41, %d) differs between calls", size)
		}
		if size >= 8 && bytes.Equal(a, valueOf(42, size)) {
			t.Errorf("keys 41 and 42 got the same %d-byte value", size)
		}
	}
	if bytes.Equal(valueOf(0, 256)[:128], valueOf(0, 256)[128:]) {
		t.Error("a value repeats itself: it would compress")
	}
}

func TestKeyOfSorts(t *testing.T) {
	if got := string(keyOf(42)); got != "scale/0000042" {
		t.Errorf("keyOf(42) = %q", got)
	}
	if bytes.Compare(keyOf(9), keyOf(10)) >= 0 {
		t.Error("keyOf(9) does not sort before keyOf(10)")
	}
}

func TestBatches(t *testing.T) {
	for _, tc := range []struct{ n, batch, want int }{{1_000_000, 64, 15625}, {50_000, 64, 782}, {1, 64, 1}, {64, 64, 1}, {65, 64, 2}} {
		if got := batches(tc.n, tc.batch); got != tc.want {
			t.Errorf("batches(%d, %d) = %d, want %d", tc.n, tc.batch, got, tc.want)
		}
	}
}

func TestLabels(t *testing.T) {
	for _, tc := range []struct {
		spec loadSpec
		want string
	}{
		{loadSpec{keys: 1_000_000}, "1m"},
		{loadSpec{keys: 50_000}, "50k"},
		{loadSpec{keys: 1234}, "1234"},
		{loadSpec{nodes: 10_000, instances: 100_000}, "catalog-10k-nodes-100k-instances"},
	} {
		if got := tc.spec.label(); got != tc.want {
			t.Errorf("%+v: label %q, want %q", tc.spec, got, tc.want)
		}
	}
}

func TestRegistrationsCoverEveryNodeOnce(t *testing.T) {
	const nodes, instances = 100, 1000
	ids := map[string]bool{}
	perNode := map[string]int{}
	for i := range instances {
		r := registrationOf(i, nodes)
		key := r.Node + "/" + r.Service.ID
		if ids[key] {
			t.Fatalf("instance %d repeats %s", i, key)
		}
		ids[key] = true
		perNode[r.Node]++
	}
	if len(perNode) != nodes {
		t.Fatalf("%d nodes registered, want %d", len(perNode), nodes)
	}
	for n, k := range perNode {
		if k != instances/nodes {
			t.Errorf("node %s has %d instances, want %d", n, k, instances/nodes)
		}
	}
}

func TestSteady(t *testing.T) {
	flat := [][]int64{{100, 200}, {100, 200}, {100, 201}, {100, 200}}
	if !steady(flat, 4) {
		t.Error("samples within 1% are not steady")
	}
	if steady(flat[:3], 4) {
		t.Error("fewer samples than asked for count as steady")
	}
	falling := [][]int64{{100, 300}, {100, 250}, {100, 200}, {100, 200}}
	if steady(falling, 4) {
		t.Error("a member whose RSS fell by a third is steady")
	}
	if !steady(falling, 2) {
		t.Error("the last two equal samples are not steady")
	}
}

func TestLinesJudgeTheTargets(t *testing.T) {
	mk := func(rss int64, one, all time.Duration) measured {
		return measured{rss: []int64{rss, rss, rss}, restartOne: []time.Duration{one, 9 * one, one}, restartAll: []time.Duration{all}}
	}
	lode := mk(600<<20, time.Second, 2*time.Second)
	peer := mk(1000<<20, 3*time.Second, 3*time.Second)
	ls := lines("1m", lode, peer)
	if len(ls) != 3 {
		t.Fatalf("%d lines, want 3", len(ls))
	}
	want := []struct {
		name string
		pass bool
		text string
	}{
		{"scale-1m-rss-per-member", true, "BENCH scale-1m-rss-per-member lodestone=600MiB etcd=1000MiB ratio=0.60 target=<=0.7"},
		{"scale-1m-restart-one", true, "BENCH scale-1m-restart-one lodestone=1s etcd=3s ratio=0.33 target=<=0.5"}, // medians: the 9x outlier is ignored
		{"scale-1m-restart-all", false, "BENCH scale-1m-restart-all lodestone=2s etcd=3s ratio=0.67 target=<=0.5"},
	}
	for i, w := range want {
		if ls[i].Name != w.name || ls[i].Pass() != w.pass || ls[i].String() != w.text {
			t.Errorf("line %d = %q (pass %v), want %q (pass %v)", i, ls[i], ls[i].Pass(), w.text, w.pass)
		}
	}
}

func TestFigure(t *testing.T) {
	if got, want := figure("scale-1m-snapshot-size", "MiB", []string{"lodestone", "etcd"}, []float64{300, 400}),
		"FIGURE scale-1m-snapshot-size lodestone=300MiB etcd=400MiB ratio=0.75"; got != want {
		t.Errorf("figure = %q, want %q", got, want)
	}
	if got := figure("x", "s", []string{"lodestone"}, []float64{1.5}); got != "FIGURE x lodestone=1.5s" {
		t.Errorf("one-system figure = %q", got)
	}
}

func TestCheckFlagsRefusesBadInput(t *testing.T) {
	defer func(k, n, i int) { *flagKeys, *flagCatalogNodes, *flagCatalogInst = k, n, i }(*flagKeys, *flagCatalogNodes, *flagCatalogInst)
	if err := checkFlags(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	*flagKeys = 0
	if err := checkFlags(); err == nil || !strings.Contains(err.Error(), "-keys") {
		t.Errorf("-keys 0: %v", err)
	}
	*flagKeys, *flagCatalogNodes, *flagCatalogInst = 10, 100, 10
	if err := checkFlags(); err == nil || !strings.Contains(err.Error(), "-catalog-instances") {
		t.Errorf("fewer instances than nodes: %v", err)
	}
}
