package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

// Route sends requests whose host and path match to a service. Its JSON
// form is an element of the routes file's "routes" array, or the value of
// a registry key gateway/routes/<name> (where the key names it):
//
//	{"name": "api", "host": "api.example.com", "path_prefix": "/v1/", "service": "api", "strip_prefix": false}
//
// Matching: the host is compared case-insensitively without its port; a
// route with host "" matches any host and one with "*.example.com" any
// subdomain of example.com. Among the routes whose host matches, exact
// hosts win over wildcards, wildcards over "", and within each the longest
// path prefix wins. A prefix that ends in "/" matches every path below it;
// one that does not ("/api") matches "/api" itself and every path below
// "/api/", never "/apix".
type Route struct {
	Name       string `json:"name"`
	Host       string `json:"host,omitempty"`
	PathPrefix string `json:"path_prefix,omitempty"` // default "/"
	Service    string `json:"service"`
	// StripPrefix removes PathPrefix from the path sent to the origin
	// (keeping a leading "/").
	StripPrefix bool `json:"strip_prefix,omitempty"`
}

// normalize fills defaults and lowercases the host.
func (r Route) normalize() Route {
	r.Host = strings.ToLower(strings.TrimSpace(r.Host))
	if r.PathPrefix == "" {
		r.PathPrefix = "/"
	}
	return r
}

// Validate reports what is wrong with r as a *RouteError.
func (r Route) Validate() error {
	bad := func(format string, args ...any) error {
		return &RouteError{Name: r.Name, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case r.Name == "":
		return bad("empty name")
	case strings.ContainsAny(r.Name, "/ \t\n"):
		return bad("name must not contain '/' or spaces")
	case r.Service == "":
		return bad("empty service")
	case strings.Contains(r.Service, "/"):
		return bad("service %q must not contain '/'", r.Service)
	case r.PathPrefix != "" && !strings.HasPrefix(r.PathPrefix, "/"):
		return bad("path_prefix %q must start with '/'", r.PathPrefix)
	case strings.Contains(r.Host, ":"):
		return bad("host %q must not carry a port", r.Host)
	case strings.Contains(strings.TrimPrefix(r.Host, "*."), "*"):
		return bad("host %q: only a leading '*.' wildcard is allowed", r.Host)
	}
	return nil
}

// routesFile is the routes file's JSON form.
type routesFile struct {
	Routes []Route `json:"routes"`
}

// LoadRoutesFile reads static routes from a JSON file:
//
//	{"routes": [
//	  {"name": "web", "path_prefix": "/", "service": "web"},
//	  {"name": "api", "host": "api.example.com", "path_prefix": "/v1/", "service": "api", "strip_prefix": true}
//	]}
//
// Unknown fields, duplicate names and invalid routes are errors.
func LoadRoutesFile(path string) ([]Route, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read routes file: %w", err)
	}
	return ParseRoutes(b)
}

// ParseRoutes parses the routes file format (see LoadRoutesFile).
func ParseRoutes(b []byte) ([]Route, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f routesFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("parse routes: %w", err)
	}
	seen := map[string]bool{}
	for i, r := range f.Routes {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("routes[%d]: %w", i, err)
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("routes[%d]: %w", i, &RouteError{Name: r.Name, Reason: "duplicate name"})
		}
		seen[r.Name] = true
		f.Routes[i] = r.normalize()
	}
	return f.Routes, nil
}

// routeEntry is one compiled route with its metrics.
type routeEntry struct {
	Route
	m *routeMetrics // nil in tests that build tables without metrics
}

// router matches requests to routes. It is immutable once built.
type router struct {
	exact    map[string][]*routeEntry // host → routes, longest prefix first
	wildcard []wildcardRoutes         // longest suffix first
	anyHost  []*routeEntry            // longest prefix first
	all      []*routeEntry            // by name
}

type wildcardRoutes struct {
	suffix string // ".example.com"
	routes []*routeEntry
}

// newRouter compiles routes (already validated and normalized).
func newRouter(entries []*routeEntry) *router {
	rt := &router{exact: map[string][]*routeEntry{}}
	wild := map[string][]*routeEntry{}
	for _, e := range entries {
		switch {
		case e.Host == "":
			rt.anyHost = append(rt.anyHost, e)
		case strings.HasPrefix(e.Host, "*."):
			s := e.Host[1:]
			wild[s] = append(wild[s], e)
		default:
			rt.exact[e.Host] = append(rt.exact[e.Host], e)
		}
	}
	byPrefix := func(rs []*routeEntry) {
		sort.SliceStable(rs, func(i, j int) bool {
			if len(rs[i].PathPrefix) != len(rs[j].PathPrefix) {
				return len(rs[i].PathPrefix) > len(rs[j].PathPrefix)
			}
			return rs[i].Name < rs[j].Name
		})
	}
	for _, rs := range rt.exact {
		byPrefix(rs)
	}
	byPrefix(rt.anyHost)
	for s, rs := range wild {
		byPrefix(rs)
		rt.wildcard = append(rt.wildcard, wildcardRoutes{suffix: s, routes: rs})
	}
	sort.Slice(rt.wildcard, func(i, j int) bool {
		if len(rt.wildcard[i].suffix) != len(rt.wildcard[j].suffix) {
			return len(rt.wildcard[i].suffix) > len(rt.wildcard[j].suffix)
		}
		return rt.wildcard[i].suffix < rt.wildcard[j].suffix
	})
	rt.all = append(rt.all, entries...)
	sort.Slice(rt.all, func(i, j int) bool { return rt.all[i].Name < rt.all[j].Name })
	return rt
}

// match returns the route for host (as sent, maybe with a port, any case)
// and path, or nil. It does not allocate unless host has upper case.
func (rt *router) match(host, path string) *routeEntry {
	host = hostOnly(host)
	if hasUpper(host) {
		host = strings.ToLower(host)
	}
	if rs := rt.exact[host]; rs != nil {
		if e := matchPrefix(rs, path); e != nil {
			return e
		}
	}
	for _, w := range rt.wildcard {
		if len(host) > len(w.suffix) && strings.HasSuffix(host, w.suffix) {
			if e := matchPrefix(w.routes, path); e != nil {
				return e
			}
		}
	}
	return matchPrefix(rt.anyHost, path)
}

func matchPrefix(rs []*routeEntry, path string) *routeEntry {
	for _, e := range rs {
		if pathHasPrefix(path, e.PathPrefix) {
			return e
		}
	}
	return nil
}

// pathHasPrefix implements the segment-aware prefix rule (see Route).
func pathHasPrefix(path, prefix string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	if strings.HasSuffix(prefix, "/") || len(path) == len(prefix) {
		return true
	}
	return path[len(prefix)] == '/'
}

// stripPrefix removes prefix from path, keeping a leading "/".
func stripPrefix(path, prefix string) string {
	p := strings.TrimPrefix(path, strings.TrimSuffix(prefix, "/"))
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return p
}

// hostOnly strips a port from a Host header value ("a:80", "[::1]:80").
func hostOnly(h string) string {
	i := strings.LastIndexByte(h, ':')
	if i < 0 || i < strings.LastIndexByte(h, ']') {
		return strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	}
	return strings.TrimSuffix(strings.TrimPrefix(h[:i], "["), "]")
}

func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
}
