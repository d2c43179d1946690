package consulapi

import (
	"net/url"
	"slices"
	"testing"
)

var paramCases = []string{
	"", "index=7", "index=7&wait=10000ms", "recurse", "recurse&keys", "recurse=", "a=1&a=2&a=3",
	"index=1;wait=2", "index=1&index=2", "%69ndex=9", "ind%65x=9&index=1", "tag=a+b&tag=c%20d",
	"tag=%zz&tag=ok", "%zz=1&index=3", "&&index=4&&", "=5&index=6", "index", "index=&wait=1s",
	"separator=%2F", "passing=false&passing=true", "wait=10s;x&wait=20s",
}

var paramNames = []string{"index", "wait", "recurse", "keys", "a", "tag", "separator", "passing", "", "x"}

// checkParams compares Params with url.ParseQuery on one query string.
func checkParams(t *testing.T, raw string) {
	want, _ := url.ParseQuery(raw) // NB: the pairs it could not parse are skipped, as Params skips them
	p := Params(raw)
	for _, name := range paramNames {
		vals, ok := want[name]
		got, gotOK := p.Lookup(name)
		if gotOK != ok || got != want.Get(name) {
			t.Fatalf("%q: Lookup(%q) = %q, %v; url.ParseQuery has %q, %v", raw, name, got, gotOK, want.Get(name), ok)
		}
		if all := p.All(name); !slices.Equal(all, vals) {
			t.Fatalf("%q: All(%q) = %q; url.ParseQuery has %q", raw, name, all, vals)
		}
		if p.Has(name) != ok || p.Get(name) != want.Get(name) {
			t.Fatalf("%q: Has/Get(%q) disagree with Lookup", raw, name)
		}
	}
}

// TestParamsAgreeWithParseQuery: reading the query in place answers as
// the url.Values net/url builds, escapes, repeats, bare names and
// unparseable pairs included.
func TestParamsAgreeWithParseQuery(t *testing.T) {
	for _, raw := range paramCases {
		checkParams(t, raw)
	}
}

func FuzzParams(f *testing.F) {
	for _, raw := range paramCases {
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw string) { checkParams(t, raw) })
}

// TestParamsDoNotAllocate: a blocking query's parameters are read without
// an allocation (url.Values cost ~800 bytes per request).
func TestParamsDoNotAllocate(t *testing.T) {
	p := Params("index=123456&wait=10000ms&stale")
	allocs := testing.AllocsPerRun(100, func() {
		if p.Get("index") != "123456" || p.Get("wait") != "10000ms" || !p.Has("stale") || p.Has("consistent") {
			t.Fatal("wrong values")
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per read of three parameters, want 0", allocs)
	}
}
