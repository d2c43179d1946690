package consulapi

import (
	"strings"

	"github.com/hashicorp/go-bexpr"
)

// listFilter is a listing's ?filter and ?node-meta, as Consul reads them.
//
// ?filter is a go-bexpr expression (the library Consul uses) over the
// listing's elements as this API writes them, so the selectors are
// Consul's: the JSON field names of its types (Service.Tags, Node.Meta.env,
// Checks.Status, ServiceName, ...). ?node-meta=key:value (repeatable) keeps
// only what lives on nodes carrying every such pair.
type listFilter struct {
	expr     *bexpr.Filter // nil: no ?filter
	nodeMeta map[string]string
}

// parseListFilter reads r's ?filter and ?node-meta. A bad expression is a
// 400 with the parser's error, in Consul's words.
func parseListFilter(v Params) (listFilter, error) {
	var f listFilter
	if s := v.Get("filter"); s != "" {
		expr, err := bexpr.CreateFilter(s)
		if err != nil {
			// NB: Consul's words, with the parser's error after them.
			why := strings.TrimPrefix(err.Error(), "failed to create boolean expression evaluator: ")
			return f, badRequest("Failed to create boolean expression evaluator: %s", why)
		}
		f.expr = expr
	}
	for _, pair := range v.All("node-meta") {
		if f.nodeMeta == nil {
			f.nodeMeta = map[string]string{}
		}
		// NB: as Consul: the first ':' splits; without one the value is "".
		k, val, _ := strings.Cut(pair, ":")
		f.nodeMeta[k] = val
	}
	return f, nil
}

// active reports whether f removes anything at all.
func (f listFilter) active() bool { return f.expr != nil || len(f.nodeMeta) > 0 }

// nodeMatches reports whether a node with meta passes ?node-meta.
func (f listFilter) nodeMatches(meta map[string]string) bool {
	for k, v := range f.nodeMeta {
		got, ok := meta[k]
		if !ok || got != v {
			return false
		}
	}
	return true
}

// filterItems runs f's expression over items, a slice or a map of the JSON
// shapes the listing answers with, and returns what passes, of the same
// type. An expression that cannot be evaluated against them (a selector
// the elements do not have) is a 400, as Consul refuses it.
func filterItems[T any](f listFilter, items T) (T, error) {
	if f.expr == nil {
		return items, nil
	}
	out, err := f.expr.Execute(items)
	if err != nil {
		return items, badRequest("Failed to evaluate filter expression: %v", err)
	}
	return out.(T), nil
}

// filterAgentListing applies ?filter to an agent listing (/v1/agent/services,
// /v1/agent/checks: maps by id, filtered on their values as Consul does).
// The agent endpoints take no ?node-meta: they list one node.
func filterAgentListing[T any](v Params, items T) (T, error) {
	f, err := parseListFilter(v)
	if err != nil {
		return items, err
	}
	return filterItems(f, items)
}
