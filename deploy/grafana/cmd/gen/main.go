// Command gen writes the dashboards of package grafana into the directory
// given (default: the current one). Run from deploy/: go run ./grafana/cmd/gen grafana
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/lodestone-kv/lodestone/deploy/grafana"
)

func main() {
	dir := "."
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	if err := write(dir); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	files, err := grafana.Dashboards()
	if err != nil {
		return err
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
