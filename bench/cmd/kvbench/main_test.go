package main

import (
	"slices"
	"testing"
)

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
