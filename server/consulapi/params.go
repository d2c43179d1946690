package consulapi

import (
	"net/url"
	"strings"
)

// Params is a request's raw query string, read in place. It answers as
// the url.Values of url.ParseQuery would (first value wins, a name with no
// "=" has the value "", pairs that do not parse are skipped) without
// building them: a map, a slice per name and the strings, ~800 bytes for
// a blocking query's "index" and "wait", allocated for each of the
// thousands of queries a second a busy leader re-reads.
type Params string

// Query returns r's parameters.
func Query(u *url.URL) Params { return Params(u.RawQuery) }

// Get returns the first value of name, or "".
func (p Params) Get(name string) string {
	v, _ := p.Lookup(name)
	return v
}

// Has reports whether name is present, with a value or without.
func (p Params) Has(name string) bool {
	_, ok := p.Lookup(name)
	return ok
}

// Lookup returns the first value of name and whether it is present.
func (p Params) Lookup(name string) (string, bool) {
	for rest := string(p); rest != ""; {
		var k, v string
		var ok bool
		if k, v, rest, ok = nextParam(rest, name); ok && k == name {
			return v, true
		}
	}
	return "", false
}

// All returns every value of name, in order.
func (p Params) All(name string) []string {
	var vals []string
	for rest := string(p); rest != ""; {
		var k, v string
		var ok bool
		if k, v, rest, ok = nextParam(rest, name); ok && k == name {
			vals = append(vals, v)
		}
	}
	return vals
}

// nextParam splits the first pair off rest and decodes it; ok is false
// for a pair url.ParseQuery would skip, and for a key other than name,
// whose value is not unescaped.
func nextParam(rest, name string) (key, value, left string, ok bool) {
	pair, left, _ := strings.Cut(rest, "&")
	if pair == "" || strings.Contains(pair, ";") {
		return "", "", left, false
	}
	key, value, _ = strings.Cut(pair, "=")
	if key, ok = unescape(key); !ok || key != name {
		return key, "", left, false
	}
	value, ok = unescape(value)
	return key, value, left, ok
}

// unescape is url.QueryUnescape, which allocates only when s holds an
// escape.
func unescape(s string) (string, bool) {
	if !strings.ContainsAny(s, "%+") {
		return s, true
	}
	u, err := url.QueryUnescape(s)
	return u, err == nil
}
