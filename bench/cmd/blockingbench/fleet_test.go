package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestPlanQueries: every key in one spec exactly once, no process over
// its limit, each target its round-robin share, and past perSource a
// source address of its own for every process.
func TestPlanQueries(t *testing.T) {
	for _, tc := range []struct {
		n, targets, perProcess int
		wantProcs              int
	}{
		{1, 1, 12500, 1},
		{10000, 1, 12500, 1},
		{50000, 4, 12500, 4},
		{50000, 3, 12500, 6}, // Consul's three servers: 16,667 each, two processes each
		{50000, 5, 12500, 5},
		{7, 3, 2, 4}, // shares 3, 2, 2: two processes, then one each
		{2, 3, 5, 2}, // fewer queries than targets: the third gets none
	} {
		t.Run(fmt.Sprintf("n=%d/targets=%d/per=%d", tc.n, tc.targets, tc.perProcess), func(t *testing.T) {
			var targets []string
			for i := range tc.targets {
				targets = append(targets, fmt.Sprintf("http://t%d", i))
			}
			specs := planQueries(targets, tc.n, tc.perProcess)
			if len(specs) != tc.wantProcs {
				t.Errorf("%d processes, want %d", len(specs), tc.wantProcs)
			}
			owner := make([]int, tc.n)
			perTarget := map[string]int{}
			for si, s := range specs {
				if s.Count < 1 || s.Count > tc.perProcess {
					t.Errorf("spec %d holds %d queries, want 1..%d", si, s.Count, tc.perProcess)
				}
				if s.Keys != tc.n {
					t.Errorf("spec %d: Keys %d, want %d", si, s.Keys, tc.n)
				}
				for i := range s.Count {
					k := s.key(i)
					if k < 0 || k >= tc.n {
						t.Fatalf("spec %d key %d: %d out of range", si, i, k)
					}
					if owner[k] != 0 {
						t.Errorf("key %d in specs %d and %d", k, owner[k]-1, si)
					}
					owner[k] = si + 1
					if !s.holds(k) {
						t.Errorf("spec %d does not hold its own key %d", si, k)
					}
					if want := targets[k%tc.targets]; s.Target != want {
						t.Errorf("key %d on %s, want %s (round-robin)", k, s.Target, want)
					}
				}
				perTarget[s.Target] += s.Count
			}
			for k, o := range owner {
				if o == 0 {
					t.Errorf("key %d in no spec", k)
				}
				held := 0
				for _, s := range specs {
					if s.holds(k) {
						held++
					}
				}
				if held != 1 {
					t.Errorf("key %d held by %d specs", k, held)
				}
			}
			for _, target := range targets {
				if got := perTarget[target]; got > maxShare(tc.n, tc.targets) {
					t.Errorf("%s holds %d, over the share %d", target, got, maxShare(tc.n, tc.targets))
				}
			}
			var sources []string
			for _, s := range specs {
				sources = append(sources, s.Source)
			}
			if tc.n > perSource {
				if slices.Contains(sources, "") || len(slices.Compact(slices.Sorted(slices.Values(sources)))) != len(specs) {
					t.Errorf("sources %q: want one of its own per process", sources)
				}
			} else if slices.ContainsFunc(sources, func(s string) bool { return s != "" }) {
				t.Errorf("sources %q: want the kernel's choice at %d queries", sources, tc.n)
			}
		})
	}
}

func TestHoldsOutside(t *testing.T) {
	s := querySpec{Offset: 2, Stride: 4, Count: 3} // keys 2, 6, 10
	for k, want := range map[int]bool{0: false, 2: true, 3: false, 6: true, 10: true, 14: false, -2: false} {
		if got := s.holds(k); got != want {
			t.Errorf("holds(%d) = %v, want %v", k, got, want)
		}
	}
}

// TestLayoutFor50k: the defaults spread 50,000 queries over four
// learners and Consul's three servers, each under a 20,000 open-file
// limit, and refuse one follower holding them all.
func TestLayoutFor50k(t *testing.T) {
	if got := learnerCount(50000); got != 4 {
		t.Errorf("learnerCount(50000) = %d, want 4", got)
	}
	if got := learnerCount(10000); got != 1 {
		t.Errorf("learnerCount(10000) = %d, want 1", got)
	}
	for n, want := range map[int]string{10000: "follower", 20000: "followers", 50000: "all"} {
		if got := consulQueriesOn(n); got != want {
			t.Errorf("consulQueriesOn(%d) = %q, want %q", n, got, want)
		}
	}
	if err := checkShares("lodestone", 50000, 4, 20000); err != nil {
		t.Errorf("four learners: %v", err)
	}
	if err := checkShares("consul", 50000, 3, 20000); err != nil {
		t.Errorf("three Consul servers: %v", err)
	}
	err := checkShares("consul", 50000, 1, 20000)
	if err == nil || !strings.Contains(err.Error(), "50000 connections each") {
		t.Errorf("one server with 50,000 queries: %v, want refused", err)
	}
}

func TestMemberRSSPerQuery(t *testing.T) {
	roles := []string{"leader", "f1", "f2", "l1", "l2"}
	without := []float64{100 << 20, 100 << 20, 100 << 20, 100 << 20, 100 << 20}
	with := []float64{110 << 20, 100 << 20, 100 << 20, 200 << 20, 150 << 20}
	per := []int{0, 0, 0, 10240, 5120}
	if got, want := memberRSSPerQuery(roles, without, with, per), "l1=10.0,l2=10.0"; got != want {
		t.Errorf("memberRSSPerQuery = %q, want %q", got, want)
	}
	if got := memberRSSPerQuery(roles, without, with, make([]int, 5)); got != "none" {
		t.Errorf("no queries: %q, want none", got)
	}
	f := &fleet{specs: planQueries([]string{"a", "b"}, 5, 2)}
	if got := f.perTarget([]string{"x", "a", "b"}); !slices.Equal(got, []int{0, 3, 2}) {
		t.Errorf("perTarget = %v, want [0 3 2]", got)
	}
}
