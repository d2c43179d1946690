// Package metricnames finds the metric names that Grafana dashboards and
// Prometheus rule files query, and the names a /metrics page exports, so a
// test can fail when a dashboard panel or an alert reads a metric no
// binary serves (a typo, a rename, a metric removed).
//
// PromQL is parsed with Prometheus' own parser, so function names, label
// names, keywords and strings are never mistaken for metrics. Grafana's
// interval variables ($__rate_interval and the like) are replaced by a
// duration first; other variables may appear only inside label matcher
// strings, where PromQL allows any text.
package metricnames

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// Ref is one metric name a query reads, and where the query is.
type Ref struct {
	Name  string
	Where string // e.g. "cluster.json: panel \"Commit latency\""
}

// grafanaIntervals are Grafana's built-in duration variables.
var grafanaIntervals = regexp.MustCompile(`\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}`)

var promql = parser.NewParser(parser.Options{})

// InExpr returns the metric names expr selects, sorted and without
// repeats. A selector without a metric name (only label matchers) is an
// error: the name it reads could not be checked.
func InExpr(expr string) ([]string, error) {
	e, err := promql.ParseExpr(grafanaIntervals.ReplaceAllString(expr, "5m"))
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", expr, err)
	}
	var names []string
	var bad error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
		}
		if name == "" {
			bad = fmt.Errorf("%q: selector %s names no metric", expr, vs)
			return nil
		}
		names = append(names, name)
		return nil
	})
	if bad != nil {
		return nil, bad
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// labelValues is Grafana's Prometheus variable query for a label's values.
var labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.*?)\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)

// InVariableQuery returns the metric names a Grafana variable query
// reads: label_values(selector, label), or a PromQL query.
func InVariableQuery(q string) ([]string, error) {
	if m := labelValues.FindStringSubmatch(q); m != nil {
		return InExpr(m[1])
	}
	if strings.HasPrefix(strings.TrimSpace(q), "label_values(") {
		return nil, fmt.Errorf("variable query %q: want label_values(selector, label)", q)
	}
	return InExpr(q)
}

// dashboardJSON is the part of Grafana's dashboard model that holds
// queries: panels (and panels nested in collapsed rows) with targets, and
// query variables.
type dashboardJSON struct {
	Title  string       `json:"title"`
	Panels []panelJSON  `json:"panels"`
	Tmpl   templateJSON `json:"templating"`
}

type panelJSON struct {
	Title   string       `json:"title"`
	Type    string       `json:"type"`
	Targets []targetJSON `json:"targets"`
	Panels  []panelJSON  `json:"panels"`
}

type targetJSON struct {
	Expr string `json:"expr"`
}

type templateJSON struct {
	List []struct {
		Name  string          `json:"name"`
		Type  string          `json:"type"`
		Query json.RawMessage `json:"query"`
	} `json:"list"`
}

// InDashboard returns every metric name the dashboard's panels and query
// variables read. file names the dashboard in each Ref.
func InDashboard(file string, data []byte) ([]Ref, error) {
	var d dashboardJSON
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var refs []Ref
	var walk func(ps []panelJSON) error
	walk = func(ps []panelJSON) error {
		for _, p := range ps {
			for _, t := range p.Targets {
				names, err := InExpr(t.Expr)
				if err != nil {
					return fmt.Errorf("%s: panel %q: %w", file, p.Title, err)
				}
				for _, n := range names {
					refs = append(refs, Ref{n, fmt.Sprintf("%s: panel %q", file, p.Title)})
				}
			}
			if err := walk(p.Panels); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(d.Panels); err != nil {
		return nil, err
	}
	for _, v := range d.Tmpl.List {
		if v.Type != "query" {
			continue
		}
		q, err := variableQuery(v.Query)
		if err != nil {
			return nil, fmt.Errorf("%s: variable %s: %w", file, v.Name, err)
		}
		names, err := InVariableQuery(q)
		if err != nil {
			return nil, fmt.Errorf("%s: variable %s: %w", file, v.Name, err)
		}
		for _, n := range names {
			refs = append(refs, Ref{n, fmt.Sprintf("%s: variable %s", file, v.Name)})
		}
	}
	return refs, nil
}

// variableQuery reads a query variable's query: a string, or Grafana's
// newer object form {"query": "..."}.
func variableQuery(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("query is neither a string nor an object with a query: %s", raw)
	}
	return obj.Query, nil
}

type ruleFileYAML struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Record string `json:"record"`
			Alert  string `json:"alert"`
			Expr   string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

// InRules returns the metric names a Prometheus rule file's expressions
// read, and the names its recording rules write.
func InRules(file string, data []byte) (refs []Ref, recorded []string, err error) {
	var f ruleFileYAML
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", file, err)
	}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			what := "alert " + r.Alert
			if r.Record != "" {
				what = "record " + r.Record
				recorded = append(recorded, r.Record)
			}
			names, err := InExpr(r.Expr)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %s: %w", file, what, err)
			}
			for _, n := range names {
				refs = append(refs, Ref{n, file + ": " + what})
			}
		}
	}
	return refs, recorded, nil
}

// Exported returns the series names a /metrics page in Prometheus' text
// format serves: a counter's or gauge's name, a histogram's _bucket, _sum
// and _count, a summary's name, _sum and _count. A family with no series
// is not served, so it does not count.
func Exported(r io.Reader) (map[string]bool, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for name, mf := range families {
		if len(mf.GetMetric()) == 0 {
			continue
		}
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			out[name+"_bucket"], out[name+"_sum"], out[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			out[name], out[name+"_sum"], out[name+"_count"] = true, true, true
		default:
			out[name] = true
		}
	}
	return out, nil
}

// Missing returns the refs whose name is in none of the sets: what the
// binaries export, what recording rules write, what Prometheus itself
// makes (up).
func Missing(refs []Ref, known ...map[string]bool) []Ref {
	var out []Ref
	for _, r := range refs {
		found := false
		for _, k := range known {
			found = found || k[r.Name]
		}
		if !found {
			out = append(out, r)
		}
	}
	return out
}

// PrometheusMade are the series Prometheus makes for every target
// itself, which rules may read though no binary exports them.
var PrometheusMade = map[string]bool{"up": true}
