// Package member names the members of a Lodestone cluster: the Raft id a
// member's name maps to, and the name=peer-address list that bootstraps a
// cluster (--initial-cluster). The server, the offline snapshot tools and
// the chaos harness all derive ids here, so they agree by construction.
package member

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
)

// ID derives a member's Raft id from its name: FNV-64a, never 0 (Raft
// reserves 0 for "none"). cluster.proto's Member.id is this value.
func ID(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	if id := h.Sum64(); id != 0 {
		return id
	}
	return 1
}

// ParseCluster parses "n1=host:port,n2=host:port" into name → peer address.
// An empty string is an empty cluster.
func ParseCluster(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		name, addr, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name == "" || addr == "" {
			return nil, fmt.Errorf("initial cluster entry %q is not name=host:port", part)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("initial cluster names %q twice", name)
		}
		out[name] = addr
	}
	return out, nil
}

// FormatCluster is the inverse of ParseCluster, sorted by name.
func FormatCluster(m map[string]string) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + m[n]
	}
	return strings.Join(parts, ",")
}
