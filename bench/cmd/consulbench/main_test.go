package main

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"
)

// TestLines pins the four BENCH lines' names, order, medians and targets
// (issue 40, "Done when").
func TestLines(t *testing.T) {
	lode := map[string][]sample{
		"kv-put":           {{throughput: 7000, p99: 20}, {throughput: 6000, p99: 30}, {throughput: 8000, p99: 25}},
		"kv-get":           {{throughput: 20000, p99: 5}, {throughput: 21000, p99: 4}, {throughput: 19000, p99: 6}},
		"catalog-register": {{throughput: 5000, p99: 30}, {throughput: 5200, p99: 31}, {throughput: 4800, p99: 29}},
	}
	peer := map[string][]sample{
		"kv-put":           {{throughput: 1200, p99: 400}, {throughput: 1100, p99: 380}, {throughput: 1000, p99: 420}},
		"kv-get":           {{throughput: 9000, p99: 9}, {throughput: 10000, p99: 8}, {throughput: 11000, p99: 7}},
		"catalog-register": {{throughput: 1000, p99: 500}, {throughput: 1100, p99: 450}, {throughput: 900, p99: 550}},
	}
	var got []string
	for _, l := range lines(lode, peer) {
		got = append(got, l.String())
	}
	want := []string{
		"BENCH consul-kv-put-throughput lodestone=7000ops/s consul=1100ops/s ratio=6.36 target=>=3.0",
		"BENCH consul-kv-put-p99 lodestone=25ms consul=400ms ratio=0.06 target=<=0.25",
		"BENCH consul-kv-get-throughput lodestone=20000ops/s consul=10000ops/s ratio=2.00 target=>=2.0",
		"BENCH consul-catalog-register-throughput lodestone=5000ops/s consul=1000ops/s ratio=5.00 target=>=2.0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("lines:\n got: %q\nwant: %q", got, want)
	}
	delete(lode, "kv-put")
	if got := lines(lode, peer); len(got) != 2 || got[0].Name != "consul-kv-get-throughput" {
		t.Errorf("without the puts: %v, want the get and register lines only", got)
	}
}

func TestRegisterBody(t *testing.T) {
	var r struct {
		Node, Address string
		Service       struct {
			ID, Service string
			Port        int
		}
	}
	if err := json.Unmarshal(registerBody(7, 70000), &r); err != nil {
		t.Fatal(err)
	}
	if r.Node != "cb-007-000070000" || r.Address != "10.7.17.112" || r.Service.ID != "web-cb-007-000070000" || r.Service.Service != "web" || r.Service.Port != 8080 {
		t.Errorf("registration %+v", r)
	}
	seen := map[string]bool{}
	for c := range 64 {
		for s := range 300 {
			var r registration
			json.Unmarshal(registerBody(c, s), &r)
			if seen[r.Node] {
				t.Fatalf("node %s registered twice", r.Node)
			}
			seen[r.Node] = true
		}
	}
}

func TestCheckEntries(t *testing.T) {
	key := getKey(42)
	ok := []kvEntry{{Key: key, Value: make([]byte, 256)}}
	if err := checkEntries(key, ok, 256); err != nil {
		t.Errorf("a right answer: %v", err)
	}
	for name, got := range map[string][]kvEntry{
		"none":        nil,
		"two":         {ok[0], ok[0]},
		"other key":   {{Key: getKey(43), Value: make([]byte, 256)}},
		"short value": {{Key: key, Value: make([]byte, 255)}},
	} {
		if err := checkEntries(key, got, 256); !errors.Is(err, errWrongAnswer) {
			t.Errorf("%s: %v, want errWrongAnswer", name, err)
		}
	}
}

// Both systems read the same keys in the same order, spread over all of
// them.
func TestDraw(t *testing.T) {
	hits := make([]int, 10)
	for c := range 64 {
		for s := range 100 {
			if draw(c, s) != draw(c, s) {
				t.Fatal("draw is not a function of its arguments")
			}
			hits[draw(c, s)%10]++
		}
	}
	for i, n := range hits {
		if n < 500 || n > 780 {
			t.Errorf("key class %d drawn %d times of 6400", i, n)
		}
	}
	if putKey(3, 12) != "consulbench/put/003/000000012" || getKey(7) != "consulbench/get/00007" {
		t.Errorf("keys %s, %s", putKey(3, 12), getKey(7))
	}
}

func TestSelectWorkloads(t *testing.T) {
	got, err := selectWorkloads("catalog-register, kv-put")
	if err != nil || len(got) != 2 || got[0].name != "kv-put" || got[1].name != "catalog-register" {
		t.Errorf("selectWorkloads = %v, %v; want kv-put, catalog-register in that order", got, err)
	}
	if all, err := selectWorkloads("all"); err != nil || len(all) != 3 {
		t.Errorf("all: %v, %v", all, err)
	}
	for _, bad := range []string{"", "kv-put,range", "put"} {
		if _, err := selectWorkloads(bad); err == nil {
			t.Errorf("selectWorkloads(%q) succeeded", bad)
		}
	}
}

func TestCPULine(t *testing.T) {
	got := cpuLine(getWorkload, []sample{{serverCPU: 28}, {serverCPU: 30}, {serverCPU: 25}}, []sample{{serverCPU: 46}, {serverCPU: 53}, {serverCPU: 35}})
	want := "cpu: kv-get server-cpu per op, medians: lodestone=28us consul=46us (consul/lodestone 1.64); no target"
	if got != want {
		t.Errorf("cpuLine:\n got: %s\nwant: %s", got, want)
	}
}

// TestWindows checks that an op lands in the window it completed in,
// clamped to the first and last, and that each window's p99 is printed
// in order.
func TestWindows(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		from time.Time
		want int
	}{
		{now.Add(-1500 * time.Millisecond), 1},
		{now.Add(time.Hour), 0},  // before the window: its first
		{now.Add(-time.Hour), 3}, // after it: its last
	} {
		n, class := windowClasses(c.from, 4*time.Second, time.Second)
		if n != 4 {
			t.Fatalf("windowClasses(4s, 1s) made %d windows, want 4", n)
		}
		if got := class(0, 0); got != c.want {
			t.Errorf("an op completing %v after the window's start is in window %d, want %d", now.Sub(c.from), got, c.want)
		}
	}
	if n, _ := windowClasses(now, 2500*time.Millisecond, time.Second); n != 3 {
		t.Errorf("a 2.5s window in 1s windows made %d, want 3 (the last one short)", n)
	}
	ms := time.Millisecond
	got := windowP99s([][]time.Duration{{ms, 2 * ms}, {30 * ms}, nil})
	if want := "2,30,0"; got != want {
		t.Errorf("windowP99s = %q, want %q", got, want)
	}
}
