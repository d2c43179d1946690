package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/tlsutil"
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

func TestSchedule(t *testing.T) {
	for _, tc := range []struct {
		name    string
		clients []int
		secured int
		want    []step
	}{
		{"secure runs beside the plain 64-client runs", []int{1, 64}, 2,
			[]step{{clients: 1, systems: []int{0, 1}}, {clients: 64, systems: []int{0, 1}, secured: []int{0, 1}}}},
		{"-secure=false", []int{1, 64}, 0,
			[]step{{clients: 1, systems: []int{0, 1}}, {clients: 64, systems: []int{0, 1}}}},
		{"no plain 64-client step: a step of their own", []int{1}, 2,
			[]step{{clients: 1, systems: []int{0, 1}}, {clients: 64, secured: []int{0, 1}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := schedule(tc.clients, 2, tc.secured)
			if !slices.EqualFunc(got, tc.want, func(a, b step) bool {
				return a.clients == b.clients && slices.Equal(a.systems, b.systems) && slices.Equal(a.secured, b.secured)
			}) {
				t.Errorf("schedule(%v, 2, %d) = %+v, want %+v", tc.clients, tc.secured, got, tc.want)
			}
		})
	}
}

// TestSecureLines pins the two secure BENCH lines' shape (bench/README.md,
// "Reading the output").
func TestSecureLines(t *testing.T) {
	var got []string
	for _, l := range secureLines(8600, 4300, 9000) {
		got = append(got, l.String())
	}
	want := []string{
		"BENCH put-64clients-throughput-secure lodestone=8600ops/s etcd=4300ops/s ratio=2.00 target=>=1.5",
		"BENCH put-64clients-secure-vs-plain lodestone-secure=8600ops/s lodestone-plain=9000ops/s ratio=0.96 target=>=0.9",
	}
	if !slices.Equal(got, want) {
		t.Errorf("secureLines:\n got: %q\nwant: %q", got, want)
	}
	if n := len(secureLines(8600, 4300, math.NaN())); n != 1 {
		t.Errorf("without a plain 64-client figure: %d lines, want only the throughput-secure one", n)
	}
}

func TestEtcdTokenMetadata(t *testing.T) {
	var tok etcdToken
	if md, _ := tok.GetRequestMetadata(context.Background()); len(md) != 0 {
		t.Errorf("before login: metadata %v, want none", md)
	}
	s := "abc.1"
	tok.tok.Store(&s)
	if md, _ := tok.GetRequestMetadata(context.Background()); md["token"] != "abc.1" {
		t.Errorf("after login: metadata %v, want token=abc.1", md)
	}
}

func TestSecureFiles(t *testing.T) {
	sec, err := newSecureFiles(t.TempDir(), []string{"n1", "n2", "n3"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		if _, err := tlsutil.Load(tlsutil.Files{CAFile: sec.ca, CertFile: sec.cert[n], KeyFile: sec.key[n]}, tlsutil.Options{}); err != nil {
			t.Errorf("server certificate %s: %v", n, err)
		}
	}
	if sec.client == nil || sec.client.GetClientCertificate == nil {
		t.Errorf("client config presents no certificate")
	}
}

func TestPortTaken(t *testing.T) {
	exited := fmt.Errorf("%w: n2 (exit status 1)", harness.ErrExited)
	inUse := "lodestone: listen on 127.0.0.1:41863: listen tcp 127.0.0.1:41863: bind: address already in use"
	if err := portTaken(exited, inUse); !errors.Is(err, errPortTaken) || !errors.Is(err, harness.ErrExited) {
		t.Errorf("a member that exited on a taken port: %v, want errPortTaken wrapping the exit", err)
	}
	for _, tc := range []struct {
		err   error
		tails string
	}{
		{exited, "etcd failed: data dir locked"},
		{errors.New("no leader within 30s"), inUse},
	} {
		if err := portTaken(tc.err, tc.tails); errors.Is(err, errPortTaken) {
			t.Errorf("portTaken(%v, %q) = %v, want no errPortTaken", tc.err, tc.tails, err)
		}
	}
}
