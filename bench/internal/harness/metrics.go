package harness

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
)

// ScanMetrics calls fn with each line of the metrics text at url, and
// stops at fn's first error.
func ScanMetrics(ctx context.Context, url string, fn func(line string) error) error {
	resp, err := Get(ctx, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if err := fn(sc.Text()); err != nil {
			return err
		}
	}
	return sc.Err()
}

// Scrape reads the named metrics (first sample of each; a name
// includes its labels, as in the text format) from a metrics URL.
func Scrape(ctx context.Context, url string, names ...string) (map[string]float64, error) {
	out := map[string]float64{}
	err := ScanMetrics(ctx, url, func(line string) error {
		for _, n := range names {
			if v, ok := strings.CutPrefix(line, n+" "); ok {
				if _, dup := out[n]; !dup {
					f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
					if err != nil {
						return fmt.Errorf("%s: %s: %w", url, line, err)
					}
					out[n] = f
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("%s has no %s", url, n)
		}
	}
	return out, nil
}
