package grafana

import (
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// Dashboards returns every dashboard's file name and JSON, as the files
// beside this one hold them (cmd/gen writes them).
func Dashboards() (map[string][]byte, error) {
	out := map[string][]byte{}
	for file, build := range map[string]func() *dashboard.DashboardBuilder{
		"cluster.json":  cluster,
		"raft-log.json": raftLog,
		"watches.json":  watches,
		"gateway.json":  gateway,
	} {
		b, err := render(build())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		out[file] = b
	}
	return out, nil
}
