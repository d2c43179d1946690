// Package report writes a campaign's summary (text and JSON) and its
// latency-over-time plot (SVG, drawn here) into the run directory.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/chaos/check"
	"github.com/lodestone-kv/lodestone/chaos/history"
	"github.com/lodestone-kv/lodestone/chaos/hostile"
)

// Meta describes the run.
type Meta struct {
	ID          string   `json:"id"`
	Seed        uint64   `json:"seed"`
	Nodes       int      `json:"nodes"`
	Duration    string   `json:"duration"`
	Binary      string   `json:"binary"`
	ServerArgs  []string `json:"server_args"`
	Security    string   `json:"security,omitempty"`
	Hostile     string   `json:"hostile,omitempty"`
	StaleReads  bool     `json:"client_stale_reads,omitempty"`
	Command     string   `json:"command"`
	Interrupted bool     `json:"interrupted,omitempty"`
}

// Summary is what summary.json holds.
type Summary struct {
	Meta         Meta              `json:"meta"`
	Ops          int               `json:"ops"`
	OpsByOutcome map[string]int    `json:"ops_by_outcome"`
	OpsByKind    map[string]int    `json:"ops_by_kind"`
	Faults       int               `json:"faults"`
	FaultsByKind map[string]int    `json:"faults_by_kind"`
	FaultErrors  int               `json:"fault_errors"`
	FaultSkips   int               `json:"fault_skips"`
	Anomalies    int               `json:"anomalies"`
	Results      []check.Result    `json:"results"`
	Availability []check.KindStats `json:"availability"`
	Notes        []string          `json:"notes,omitempty"`
	// Hostile is what the hostile client did and how it was refused;
	// nil when it was off (--no-hostile) or the summary was rebuilt from
	// a saved history.
	Hostile *hostile.Summary `json:"hostile,omitempty"`
}

// Build tallies a checked history.
func Build(meta Meta, h *history.History, results []check.Result, avail []check.KindStats) Summary {
	s := Summary{Meta: meta, OpsByOutcome: map[string]int{}, OpsByKind: map[string]int{}, FaultsByKind: map[string]int{},
		Results: results, Availability: avail, Notes: h.Notes}
	for _, o := range h.Ops {
		s.Ops++
		s.OpsByOutcome[o.Type]++
		s.OpsByKind[o.Workload+"/"+o.F]++
	}
	for _, f := range h.Faults {
		switch {
		case f.Skipped:
			s.FaultSkips++
			continue
		case f.Err != "":
			s.FaultErrors++
		}
		s.Faults++
		s.FaultsByKind[f.Kind]++
	}
	for _, r := range results {
		s.Anomalies += r.Count
	}
	return s
}

// Line is the campaign's last line of output.
func (s Summary) Line() string {
	return fmt.Sprintf("CHAOS ops=%d faults=%d anomalies=%d", s.Ops, s.Faults, s.Anomalies)
}

// WriteText writes the human summary.
func (s Summary) WriteText(w io.Writer) {
	m := s.Meta
	fmt.Fprintf(w, "chaos run %s\n", m.ID)
	fmt.Fprintf(w, "  seed=%d nodes=%d duration=%s binary=%s\n", m.Seed, m.Nodes, m.Duration, m.Binary)
	fmt.Fprintf(w, "  server args: %s\n", strings.Join(m.ServerArgs, " "))
	if m.Security != "" {
		fmt.Fprintf(w, "  security: %s\n", m.Security)
	}
	if m.StaleReads {
		fmt.Fprintf(w, "  client reads: STALE (harness self-test: anomalies expected)\n")
	}
	if m.Interrupted {
		fmt.Fprintf(w, "  INTERRUPTED: the campaign did not run to its end\n")
	}
	fmt.Fprintf(w, "  reproduce: %s\n", m.Command)
	fmt.Fprintf(w, "\noperations: %d (ok=%d fail=%d info=%d)\n", s.Ops, s.OpsByOutcome[history.OK], s.OpsByOutcome[history.Fail], s.OpsByOutcome[history.Info])
	for _, k := range sortedKeys(s.OpsByKind) {
		fmt.Fprintf(w, "  %-18s %d\n", k, s.OpsByKind[k])
	}
	if s.Hostile != nil {
		fmt.Fprintf(w, "\nhostile client: %s\n", s.Hostile.Head())
		for _, l := range s.Hostile.Lines() {
			fmt.Fprintf(w, "  %s\n", l)
		}
	} else if m.Hostile != "" {
		fmt.Fprintf(w, "\nhostile client: %s\n", m.Hostile)
	}
	fmt.Fprintf(w, "\nfaults: %d injected (%d with errors; %d more skipped; see faults.jsonl)\n", s.Faults, s.FaultErrors, s.FaultSkips)
	for _, k := range sortedKeys(s.FaultsByKind) {
		fmt.Fprintf(w, "  %-18s %d\n", k, s.FaultsByKind[k])
	}
	fmt.Fprintf(w, "\navailability (ops invoked inside each kind's windows; leader = time to a new leader):\n")
	for _, a := range s.Availability {
		fmt.Fprintf(w, "  %s\n", a)
	}
	fmt.Fprintf(w, "\ncheckers:\n")
	for _, r := range s.Results {
		fmt.Fprintf(w, "  %-13s %-8s %s\n", r.Checker, r.Status, r.Summary)
		for _, a := range r.Anomalies {
			fmt.Fprintf(w, "      ANOMALY %s\n", a)
		}
		for _, f := range r.Files {
			fmt.Fprintf(w, "      file %s\n", f)
		}
	}
	if len(s.Notes) > 0 {
		fmt.Fprintf(w, "\nnotes:\n")
		for _, n := range s.Notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
	fmt.Fprintf(w, "\nanomalies: %d\n", s.Anomalies)
}

// Write writes summary.txt, summary.json and latency.svg into dir.
func Write(dir string, s Summary, h *history.History) error {
	var b strings.Builder
	s.WriteText(&b)
	if err := os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write summary.txt: %w", err)
	}
	js, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode summary: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), js, 0o644); err != nil {
		return fmt.Errorf("write summary.json: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, "latency.svg"))
	if err != nil {
		return fmt.Errorf("create latency.svg: %w", err)
	}
	if err := Plot(f, h, 2*time.Second); err != nil {
		f.Close()
		return fmt.Errorf("draw latency.svg: %w", err)
	}
	return f.Close()
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
