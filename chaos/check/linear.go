package check

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/lodestone-kv/lodestone/chaos/history"
)

// LinearOptions tunes the linearizability checker.
type LinearOptions struct {
	// Timeout bounds porcupine per key; a key that times out is reported
	// Unknown, not Invalid. 0 means 30s.
	Timeout time.Duration
	// VisualizeDir receives linearizability-<key>.html for every key that
	// is not linearizable ("" writes nothing).
	VisualizeDir string
}

// maxVisualizations bounds the HTML files one check writes: a broken
// server fails every key, and five show it as well as five hundred.
const maxVisualizations = 5

// regInput is one register operation for porcupine.
type regInput struct {
	f     string // read, write, cas
	value string // written (write, cas)
	prev  string // expected (cas)
}

// regOutput is what the operation returned.
type regOutput struct {
	value    string // read: "" when the key was absent
	mismatch bool   // cas: the condition did not hold
	unknown  bool   // write/cas: outcome unknown
}

// registerModel is a single register per partition (we partition by key
// ourselves). State is the value, "" for absent: workload values are
// unique and never empty, so "ModifyIndex == i" (the server's CAS) is the
// same condition as "value == the value read at i" (the model's CAS).
var registerModel = porcupine.Model{
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(string), input.(regInput), output.(regOutput)
		switch in.f {
		case history.Read:
			return out.value == s, s
		case history.Write:
			return true, in.value
		case history.CAS:
			switch {
			case out.unknown:
				// NB: linearized here it took effect iff its condition
				// held; "never took effect" is the same op linearized
				// after everything else (its return is infinite).
				if s == in.prev {
					return true, in.value
				}
				return true, s
			case out.mismatch:
				return s != in.prev, s
			default:
				return s == in.prev, in.value
			}
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(regInput), output.(regOutput)
		switch in.f {
		case history.Read:
			return fmt.Sprintf("read -> %s", show(out.value))
		case history.Write:
			if out.unknown {
				return fmt.Sprintf("write %s -> ?", show(in.value))
			}
			return fmt.Sprintf("write %s", show(in.value))
		default:
			res := "ok"
			switch {
			case out.unknown:
				res = "?"
			case out.mismatch:
				res = "mismatch"
			}
			return fmt.Sprintf("cas %s->%s -> %s", show(in.prev), show(in.value), res)
		}
	},
	DescribeState: func(state any) string { return show(state.(string)) },
}

func show(v string) string {
	if v == "" {
		return "∅"
	}
	return v
}

// registerOps turns one key's operations into porcupine operations: ok and
// info operations, and failed CASes whose condition did not hold. Other
// failures are dropped: they had no effect and returned nothing.
func registerOps(ops []history.Op) []porcupine.Operation {
	var out []porcupine.Operation
	// Porcupine's visualization draws a row per ClientId from 0: number
	// this key's processes densely.
	clients := map[int]int{}
	for _, o := range ops {
		var in regInput
		var res regOutput
		switch {
		case o.Type == history.Fail && !(o.F == history.CAS && o.Mismatch):
			continue
		case o.F == history.Read:
			if o.Type != history.OK {
				continue
			}
			in = regInput{f: history.Read}
			res = regOutput{value: o.Value}
			if !o.Found {
				res.value = ""
			}
		case o.F == history.Write:
			in = regInput{f: history.Write, value: o.Value}
			res = regOutput{unknown: o.Type == history.Info}
		case o.F == history.CAS:
			in = regInput{f: history.CAS, value: o.Value, prev: o.Prev}
			res = regOutput{unknown: o.Type == history.Info, mismatch: o.Type == history.Fail && o.Mismatch}
		default:
			continue
		}
		if _, ok := clients[o.Proc]; !ok {
			clients[o.Proc] = len(clients)
		}
		out = append(out, porcupine.Operation{
			ClientId: clients[o.Proc], Input: in, Output: res, Call: o.Call, Return: retOf(o), Metadata: o.Seq,
		})
	}
	return out
}

// Linearizable checks the register workload per key (docs/architecture.md,
// "Reads are linearizable by default": ReadIndex, then wait for apply;
// writes are linearizable through Raft).
func Linearizable(h *history.History, opt LinearOptions) Result {
	const name = "linearizable"
	if opt.Timeout <= 0 {
		opt.Timeout = 30 * time.Second
	}
	keys, per := byKey(opsOf(h, history.Register))
	if len(keys) == 0 {
		return Result{Checker: name, Status: Skipped, Summary: "no register operations"}
	}
	var anomalies []Anomaly
	var files []string
	var unknownKeys []string
	checked := 0
	for _, k := range keys {
		ops := registerOps(per[k])
		if len(ops) == 0 {
			continue
		}
		checked += len(ops)
		switch porcupine.CheckOperationsTimeout(registerModel, ops, opt.Timeout) {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			unknownKeys = append(unknownKeys, k)
			continue
		}
		a := Anomaly{Checker: name, Key: k, What: fmt.Sprintf("%d operations on this key have no linearization", len(ops))}
		if opt.VisualizeDir != "" && len(files) < maxVisualizations {
			file := "linearizability-" + safeName(k) + ".html"
			if err := visualize(ops, h.Faults, filepath.Join(opt.VisualizeDir, file), opt.Timeout); err != nil {
				a.What += fmt.Sprintf("; visualization failed: %v", err)
			} else {
				a.What += "; see " + file
				files = append(files, file)
			}
		}
		anomalies = append(anomalies, a)
	}
	summary := fmt.Sprintf("%d register operations on %d keys checked with porcupine", checked, len(keys))
	if len(unknownKeys) > 0 {
		summary += fmt.Sprintf("; %d keys timed out (unknown): %s", len(unknownKeys), strings.Join(firstN(unknownKeys, 5), ","))
	}
	r := verdict(name, anomalies, len(unknownKeys) > 0, summary)
	r.Files = files
	return r
}

func visualize(ops []porcupine.Operation, faults []history.Fault, path string, timeout time.Duration) error {
	_, info := porcupine.CheckOperationsVerbose(registerModel, ops, timeout)
	var notes []porcupine.Annotation
	for _, f := range faults {
		if f.Skipped {
			continue
		}
		notes = append(notes, porcupine.Annotation{
			Tag: "nemesis", Start: f.Start, End: f.End,
			Description: f.Kind, Details: f.Target + " " + f.Detail,
			BackgroundColor: "#f6d8d8",
		})
	}
	info.AddAnnotations(notes)
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create visualization: %w", err)
	}
	if err := porcupine.Visualize(registerModel, info, f); err != nil {
		f.Close()
		return fmt.Errorf("render visualization: %w", err)
	}
	return f.Close()
}

func safeName(k string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, k)
}

func firstN(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
