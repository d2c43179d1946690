package main

import (
	"slices"
	"testing"
)

func TestParseCPUs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{in: "1", want: []int{1}},
		{in: "0,1", want: []int{0, 1}},
		{in: "0-3", want: []int{0, 1, 2, 3}},
		{in: "0,2-3", want: []int{0, 2, 3}},
		{in: "x", bad: true},
		{in: "3-1", bad: true},
	} {
		set, err := parseCPUs(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseCPUs(%q) = nil error, want one", tc.in)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseCPUs(%q): %v", tc.in, err)
			continue
		}
		var got []int
		for cpu := range 64 {
			if set.IsSet(cpu) {
				got = append(got, cpu)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("parseCPUs(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestParseInts(t *testing.T) {
	got, err := parseInts("1, 64")
	if err != nil || !slices.Equal(got, []int{1, 64}) {
		t.Errorf("parseInts(\"1, 64\") = %v, %v; want [1 64]", got, err)
	}
	for _, bad := range []string{"", "0", "a", "1,,2"} {
		if _, err := parseInts(bad); err == nil {
			t.Errorf("parseInts(%q) = nil error, want one", bad)
		}
	}
}

func TestInitialCluster(t *testing.T) {
	got := initialCluster([]string{"n1", "n2"}, []string{"127.0.0.1:1", "127.0.0.1:2"})
	if want := "n1=127.0.0.1:1,n2=127.0.0.1:2"; got != want {
		t.Errorf("initialCluster = %q, want %q", got, want)
	}
}
