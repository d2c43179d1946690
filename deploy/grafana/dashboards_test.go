package grafana

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestFilesAreGenerated: the JSON files are what the code writes now.
func TestFilesAreGenerated(t *testing.T) {
	want, err := Dashboards()
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range want {
		got, err := os.ReadFile(name)
		if err != nil {
			t.Errorf("%s: %v (run go run ./grafana/cmd/gen grafana from deploy/)", name, err)
			continue
		}
		if !bytes.Equal(got, b) {
			t.Errorf("%s differs from what the code writes: run go run ./grafana/cmd/gen grafana from deploy/", name)
		}
	}
	files, _ := os.ReadDir(".")
	for _, f := range files {
		if strings.HasSuffix(f.Name(), ".json") && want[f.Name()] == nil {
			t.Errorf("%s is no dashboard the code writes", f.Name())
		}
	}
}

// dash is the part of Grafana's dashboard model the checks read.
type dash struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Type       string          `json:"type"`
			Name       string          `json:"name"`
			Query      json.RawMessage `json:"query"`
			Datasource *dsRef          `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Datasource  *dsRef `json:"datasource"`
	GridPos     struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Targets []struct {
		Expr       string `json:"expr"`
		RefID      string `json:"refId"`
		Datasource *dsRef `json:"datasource"`
	} `json:"targets"`
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// checkDashboard returns what keeps a dashboard from importing anywhere
// and reading right: the datasource variable and its use, unique ids and
// refIds, panels that fit the grid without overlapping, a description
// and a query on every panel.
func checkDashboard(name string, data []byte) []string {
	var d dash
	if err := json.Unmarshal(data, &d); err != nil {
		return []string{fmt.Sprintf("%s: %v", name, err)}
	}
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, name+": "+fmt.Sprintf(format, args...)) }
	if d.UID == "" || d.Title == "" {
		bad("uid %q, title %q: both needed", d.UID, d.Title)
	}
	if d.SchemaVersion != SchemaVersion {
		bad("schemaVersion %d, want %d", d.SchemaVersion, SchemaVersion)
	}
	want := dsRef{Type: "prometheus", UID: "${" + DatasourceVariable + "}"}
	hasDS := false
	for _, v := range d.Templating.List {
		switch v.Type {
		case "datasource":
			hasDS = hasDS || (v.Name == DatasourceVariable && string(v.Query) == `"prometheus"`)
		case "query":
			if v.Datasource == nil || *v.Datasource != want {
				bad("variable %s: datasource %v, want %v", v.Name, v.Datasource, want)
			}
		}
	}
	if !hasDS {
		bad("no Prometheus datasource variable %s", DatasourceVariable)
	}
	ids := map[int]bool{}
	var cells [][2]int
	for _, p := range d.Panels {
		if ids[p.ID] || p.ID == 0 {
			bad("panel %q: id %d missing or taken", p.Title, p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			bad("panel %q: gridPos %+v off the 24-column grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if slices.Contains(cells, [2]int{x, y}) {
					bad("panel %q overlaps another at %d,%d", p.Title, x, y)
				}
				cells = append(cells, [2]int{x, y})
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || p.Description == "" {
			bad("panel %d: title %q, description %q: both needed", p.ID, p.Title, p.Description)
		}
		if p.Datasource == nil || *p.Datasource != want {
			bad("panel %q: datasource %v, want %v", p.Title, p.Datasource, want)
		}
		if len(p.Targets) == 0 {
			bad("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if strings.TrimSpace(q.Expr) == "" || q.RefID == "" || refs[q.RefID] {
				bad("panel %q: query %q refId %q: empty or repeated", p.Title, q.Expr, q.RefID)
			}
			refs[q.RefID] = true
			if q.Datasource == nil || *q.Datasource != want {
				bad("panel %q: query %q datasource %v, want %v", p.Title, q.Expr, q.Datasource, want)
			}
		}
	}
	return errs
}

func TestDashboardsImportAnywhere(t *testing.T) {
	files, err := Dashboards()
	if err != nil {
		t.Fatal(err)
	}
	uids := map[string]string{}
	for name, b := range files {
		for _, e := range checkDashboard(name, b) {
			t.Error(e)
		}
		var d dash
		json.Unmarshal(b, &d)
		if other, ok := uids[d.UID]; ok {
			t.Errorf("%s and %s share uid %s", name, other, d.UID)
		}
		uids[d.UID] = name
	}
	if len(files) != 4 {
		t.Errorf("%d dashboards, want cluster, raft log, watches and gateway", len(files))
	}
}

// TestCheckCatchesBrokenDashboards: each damage to a real dashboard is
// reported.
func TestCheckCatchesBrokenDashboards(t *testing.T) {
	files, err := Dashboards()
	if err != nil {
		t.Fatal(err)
	}
	orig := string(files["cluster.json"])
	if errs := checkDashboard("cluster.json", []byte(orig)); len(errs) != 0 {
		t.Fatalf("the original fails: %v", errs)
	}
	for name, damage := range map[string]func(string) string{
		"a fixed datasource uid": func(s string) string { return strings.Replace(s, "${DS_PROMETHEUS}", "P1809F7CD0C75ACF3", 1) },
		"no datasource variable": func(s string) string { return strings.Replace(s, `"name": "DS_PROMETHEUS"`, `"name": "ds"`, 1) },
		"a repeated id":          func(s string) string { return strings.Replace(s, `"id": 3,`, `"id": 2,`, 1) },
		"an empty query": func(s string) string {
			return strings.Replace(s, `"expr": "job:lodestone_servers_up:sum{job=~\"$job\"}"`, `"expr": ""`, 1)
		},
		"an overlap":     func(s string) string { return strings.Replace(s, `"x": 6,`, `"x": 4,`, 1) },
		"another schema": func(s string) string { return strings.Replace(s, `"schemaVersion": 39`, `"schemaVersion": 42`, 1) },
	} {
		broken := damage(orig)
		if broken == orig {
			t.Fatalf("%s: the damage changed nothing; update the test", name)
		}
		if errs := checkDashboard("cluster.json", []byte(broken)); len(errs) == 0 {
			t.Errorf("%s: not reported", name)
		}
	}
}
