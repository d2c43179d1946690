package grafana

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// DatasourceVariable is the dashboard variable every query's datasource
// names: a datasource picker, so a dashboard imports into any Grafana with
// a Prometheus datasource, by the UI or by provisioning.
const DatasourceVariable = "DS_PROMETHEUS"

// SchemaVersion is the dashboard model version the files declare: Grafana
// 10.4 and 11 read it as it is, later versions migrate it on load.
const SchemaVersion = 39

func datasource() common.DataSourceRef {
	return common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${" + DatasourceVariable + "}")}
}

// query is one PromQL target with its legend.
type query struct{ expr, legend string }

func q(expr, legend string) query { return query{expr, legend} }

// sel is the selector of the servers the job and instance variables
// chose, with more matchers appended.
func sel(metric string, more ...string) string {
	return metric + "{" + strings.Join(append([]string{`job=~"$job"`, `instance=~"$instance"`}, more...), ", ") + "}"
}

// rate is the per-second rate of a counter over Grafana's rate interval.
func rate(selector string) string { return "rate(" + selector + "[$__rate_interval])" }

func targets(qs []query) []cog.Builder[variants.Dataquery] {
	var out []cog.Builder[variants.Dataquery]
	for i, x := range qs {
		out = append(out, prometheus.NewDataqueryBuilder().
			Expr(x.expr).
			LegendFormat(x.legend).
			RefId(string(rune('A'+i))).
			Datasource(datasource()))
	}
	return out
}

// graph is a time series panel, half the dashboard wide.
func graph(title, description, unit string, qs ...query) *timeseries.PanelBuilder {
	return timeseries.NewPanelBuilder().
		Title(title).
		Description(description).
		Unit(unit).
		Datasource(datasource()).
		Targets(targets(qs)).
		Span(12).
		Height(8).
		FillOpacity(10).
		Legend(common.NewVizLegendOptionsBuilder().
			DisplayMode(common.LegendDisplayModeList).
			Placement(common.LegendPlacementBottom).
			ShowLegend(true))
}

// single is a stat panel showing the last value, a quarter wide.
func single(title, description, unit string, qs ...query) *stat.PanelBuilder {
	return stat.NewPanelBuilder().
		Title(title).
		Description(description).
		Unit(unit).
		Datasource(datasource()).
		Targets(targets(qs)).
		Span(6).
		Height(4).
		GraphMode(common.BigValueGraphModeArea).
		Orientation(common.VizOrientationAuto).
		ColorMode(common.BigValueColorModeValue).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}))
}

// thresholds colours values from each step's value on.
func thresholds(steps ...any) *dashboard.ThresholdsConfigBuilder {
	var ts []dashboard.Threshold
	for i := 0; i+1 < len(steps); i += 2 {
		var v *float64
		if f, ok := steps[i].(float64); ok {
			v = &f
		}
		ts = append(ts, dashboard.Threshold{Value: v, Color: steps[i+1].(string)})
	}
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(ts)
}

// variables are the datasource picker, then a job and an instance chosen
// from the series of metric.
func variables(b *dashboard.DashboardBuilder, metric, jobLabel string) {
	b.WithVariable(dashboard.NewDatasourceVariableBuilder(DatasourceVariable).
		Label("Datasource").
		Type("prometheus"))
	b.WithVariable(labelVariable("job", jobLabel, "label_values("+metric+", job)", false))
	b.WithVariable(labelVariable("instance", "Instance", `label_values(`+metric+`{job=~"$job"}, instance)`, true))
}

func labelVariable(name, label, query string, all bool) *dashboard.QueryVariableBuilder {
	v := dashboard.NewQueryVariableBuilder(name).
		Label(label).
		Datasource(datasource()).
		Query(dashboard.StringOrMap{String: cog.ToPtr(query)}).
		Definition(query).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
		Sort(dashboard.VariableSortAlphabeticalAsc)
	if all {
		v = v.Multi(true).IncludeAll(true).AllValue(".*").
			Current(dashboard.VariableOption{
				Text:  dashboard.StringOrArrayOfString{String: cog.ToPtr("All")},
				Value: dashboard.StringOrArrayOfString{String: cog.ToPtr("$__all")},
			})
	}
	return v
}

// newDashboard starts a dashboard with what all four share: the tag,
// links to the others, time range and refresh.
func newDashboard(uid, title, description string) *dashboard.DashboardBuilder {
	return dashboard.NewDashboardBuilder(title).
		Uid(uid).
		Description(description).
		Tags([]string{"lodestone"}).
		Editable().
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Refresh("30s").
		Time("now-1h", "now").
		Timezone(common.TimeZoneBrowser).
		Link(dashboard.NewDashboardLinkBuilder("Lodestone").
			Type(dashboard.DashboardLinkTypeDashboards).
			Tags([]string{"lodestone"}).
			AsDropdown(true).
			IncludeVars(true).
			KeepTime(true))
}

// row adds a row and its panels below it.
func row(b *dashboard.DashboardBuilder, title string, panels ...cog.Builder[dashboard.Panel]) {
	b.WithRow(dashboard.NewRowBuilder(title))
	for _, p := range panels {
		b.WithPanel(p)
	}
}

// render builds b, numbers its panels and rows in order (Grafana needs
// ids unique within a dashboard) and encodes it as the files hold it.
func render(b *dashboard.DashboardBuilder) ([]byte, error) {
	d, err := b.Build()
	if err != nil {
		return nil, err
	}
	d.SchemaVersion = SchemaVersion
	id := uint32(0)
	for _, p := range d.Panels {
		id++
		switch {
		case p.Panel != nil:
			p.Panel.Id = cog.ToPtr(id)
		case p.RowPanel != nil:
			p.RowPanel.Id = id
		}
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode dashboard %s: %w", *d.Uid, err)
	}
	return append(out, '\n'), nil
}
