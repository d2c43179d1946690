package metricnames

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestInExprFindsOnlyMetricNames(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		// Functions, aggregation keywords, label names, strings and
		// durations are not metrics.
		{`histogram_quantile(0.99, sum by (job, instance, le) (rate(lodestone_commit_latency_seconds_bucket{job=~"$job", le!="rate"}[$__rate_interval])))`,
			[]string{"lodestone_commit_latency_seconds_bucket"}},
		{`a_total / on (instance) group_left (peer) b_total > bool 0 unless c offset 5m`, []string{"a_total", "b_total", "c"}},
		{`label_replace(x, "dst", "lodestone_not_a_metric", "src", "(.*)")`, []string{"x"}},
		{`topk(3, sum without (shard) (lodestone_watch_watchers)) or vector(0)`, []string{"lodestone_watch_watchers"}},
		{`max_over_time(rate(y_total[${__interval}])[1h:5m])`, []string{"y_total"}},
		{`{__name__="named_by_matcher", job="x"}`, []string{"named_by_matcher"}},
		// A recording rule's output is a name like any other.
		{`instance:lodestone_commit_latency_seconds:p99 > 1 and z == 1`, []string{"instance:lodestone_commit_latency_seconds:p99", "z"}},
		{`scalar(max(m)) - m`, []string{"m"}},
		{`time() - 1`, nil},
	} {
		got, err := InExpr(c.expr)
		if err != nil {
			t.Errorf("%s: %v", c.expr, err)
			continue
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.expr, got, c.want)
		}
	}
}

func TestInExprRefusesWhatItCannotCheck(t *testing.T) {
	for _, expr := range []string{
		`{job="x"}`,                  // no metric name to check
		`{__name__=~"lodestone_.*"}`, // a pattern, not a name
		`rate(x[$interval])`,         // a variable outside a string
		`sum(x`,                      // does not parse
	} {
		if names, err := InExpr(expr); err == nil {
			t.Errorf("%s: accepted, names %v", expr, names)
		}
	}
}

func TestInVariableQuery(t *testing.T) {
	got, err := InVariableQuery(`label_values(lodestone_raft_term{job=~"$job"}, instance)`)
	if err != nil || !slices.Equal(got, []string{"lodestone_raft_term"}) {
		t.Errorf("label_values: %v %v", got, err)
	}
	got, err = InVariableQuery(`query_result(max by (job) (up))`)
	if err == nil {
		t.Errorf("query_result is not PromQL, yet parsed to %v", got)
	}
	if _, err := InVariableQuery(`label_values(x)`); err == nil {
		t.Error("label_values without a label accepted")
	}
}

func TestInDashboardReadsPanelsRowsAndVariables(t *testing.T) {
	d := `{"title": "t", "panels": [
	  {"type": "timeseries", "title": "p1", "targets": [{"expr": "rate(a_total[$__rate_interval])"}]},
	  {"type": "row", "title": "collapsed", "panels": [
	    {"type": "stat", "title": "p2", "targets": [{"expr": "b"}, {"expr": "c / a_total"}]}]}],
	 "templating": {"list": [
	   {"type": "datasource", "name": "DS_PROMETHEUS", "query": "prometheus"},
	   {"type": "query", "name": "job", "query": "label_values(d, job)"},
	   {"type": "query", "name": "inst", "query": {"query": "label_values(e{job=~\"$job\"}, instance)", "refId": "X"}}]}}`
	refs, err := InDashboard("d.json", []byte(d))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range refs {
		got = append(got, r.Name+"@"+r.Where)
	}
	want := []string{
		`a_total@d.json: panel "p1"`, `b@d.json: panel "p2"`, `a_total@d.json: panel "p2"`, `c@d.json: panel "p2"`,
		`d@d.json: variable job`, `e@d.json: variable inst`,
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	if _, err := InDashboard("bad.json", []byte(`{"panels": [{"title": "p", "targets": [{"expr": "sum(("}]}]}`)); err == nil ||
		!strings.Contains(err.Error(), `panel "p"`) {
		t.Errorf("a broken query: %v, want an error naming the panel", err)
	}
}

func TestInRulesSplitsReadsFromRecorded(t *testing.T) {
	rules := `groups:
  - name: g
    rules:
      - record: job:x:sum
        expr: sum by (job) (x_total)
      - alert: A
        expr: job:x:sum > 0 and on (job) up == 1
`
	refs, recorded, err := InRules("r.yml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(recorded, []string{"job:x:sum"}) {
		t.Errorf("recorded %v", recorded)
	}
	var got []string
	for _, r := range refs {
		got = append(got, r.Name+"@"+r.Where)
	}
	want := []string{"x_total@r.yml: record job:x:sum", "job:x:sum@r.yml: alert A", "up@r.yml: alert A"}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestExportedNamesSeriesAsPromQLSeesThem(t *testing.T) {
	page := `# HELP h_seconds A histogram.
# TYPE h_seconds histogram
h_seconds_bucket{le="1"} 1
h_seconds_bucket{le="+Inf"} 1
h_seconds_sum 0.5
h_seconds_count 1
# HELP c_total A counter.
# TYPE c_total counter
c_total{reason="x"} 3
# HELP s A summary.
# TYPE s summary
s{quantile="0.5"} 1
s_sum 1
s_count 1
# HELP g A gauge.
# TYPE g gauge
g 1
`
	got, err := Exported(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"h_seconds_bucket", "h_seconds_sum", "h_seconds_count", "c_total", "s", "s_sum", "s_count", "g"} {
		if !got[n] {
			t.Errorf("%s not exported", n)
		}
	}
	if got["h_seconds"] {
		t.Error("a histogram's bare name has no series")
	}
	if _, err := Exported(strings.NewReader("not a metrics page {")); err == nil {
		t.Error("a broken page parsed")
	}
}

// TestMisspelledMetricInADashboardIsCaught: a copy of a real dashboard
// with one name misspelled reports exactly that name, where the original
// reports nothing against the names it reads itself.
func TestMisspelledMetricInADashboardIsCaught(t *testing.T) {
	orig, err := os.ReadFile("../grafana/cluster.json")
	if err != nil {
		t.Fatal(err)
	}
	refs, err := InDashboard("cluster.json", orig)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, r := range refs {
		known[r.Name] = true
	}
	if m := Missing(refs, known); len(m) != 0 {
		t.Fatalf("the original misses %v", m)
	}
	const right, wrong = "lodestone_raft_commit_index", "lodestone_raft_comit_index"
	if !known[right] {
		t.Fatalf("cluster.json no longer reads %s; pick another name for this test", right)
	}
	typo := strings.Replace(string(orig), right, wrong, 1)
	refs, err = InDashboard("cluster.json", []byte(typo))
	if err != nil {
		t.Fatal(err)
	}
	m := Missing(refs, known)
	if len(m) != 1 || m[0].Name != wrong || !strings.Contains(m[0].Where, "panel") {
		t.Errorf("misspelled copy: missing %v, want just %s in a panel", m, wrong)
	}
}
