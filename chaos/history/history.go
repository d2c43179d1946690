// Package history is the record of one chaos campaign: client operations,
// watch deliveries, faults and leader observations, each with times in
// nanoseconds since the campaign started. It is plain data, written as JSON
// lines so a run can be checked again offline (`chaos check DIR`).
//
// It knows nothing of the cluster, the network or the checkers.
package history

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// Outcome types, as Jepsen names them.
const (
	// OK: the operation took effect (and its result is Value/Found).
	OK = "ok"
	// Fail: the operation certainly did not take effect.
	Fail = "fail"
	// Info: the outcome is unknown; a write may or may not have been
	// applied, at any time after its call (Jepsen's :info).
	Info = "info"
)

// Operation functions.
const (
	Read  = "read"
	Write = "write"
	CAS   = "cas"
	// Add is one counter increment (a read plus a CAS, recorded as one).
	Add = "add"
)

// Workload names.
const (
	Register = "register"
	Counter  = "counter"
	Set      = "set"
)

// Op is one client operation: its invocation, completion and outcome.
type Op struct {
	// Seq numbers operations in invocation order, from 1.
	Seq int64 `json:"seq"`
	// Proc is the logical client. A client whose operation ended Info is
	// retired and continues under a new Proc (Jepsen: a crashed process),
	// so one Proc never has two operations open.
	Proc     int    `json:"proc"`
	Workload string `json:"w"`
	F        string `json:"f"`
	Key      string `json:"key"`
	// Value is what a write or CAS wrote, or what a read returned ("" when
	// Found is false).
	Value string `json:"value,omitempty"`
	Found bool   `json:"found,omitempty"`
	// Mismatch marks a failed CAS whose condition did not hold (the server
	// said so): it proves the key's value differed from Prev, so the
	// linearizability checker keeps it, unlike other failures.
	Mismatch bool `json:"mismatch,omitempty"`
	// Prev is the value a CAS expected (what the worker read), PrevIndex
	// the ModifyIndex it conditioned on (0: absent).
	Prev      string `json:"prev,omitempty"`
	PrevIndex uint64 `json:"prev_index,omitempty"`
	// Index is the ModifyIndex of the entry written or read.
	Index uint64 `json:"index,omitempty"`
	// Node is the member the request was sent to.
	Node string `json:"node"`
	// Call and Ret are nanoseconds since the campaign started.
	Call int64  `json:"call"`
	Ret  int64  `json:"ret"`
	Type string `json:"type"`
	Err  string `json:"err,omitempty"`
	// Final marks reads made after the final heal.
	Final bool `json:"final,omitempty"`
}

// Latency is the operation's duration.
func (o Op) Latency() time.Duration { return time.Duration(o.Ret - o.Call) }

// IsWrite reports whether the operation may change state.
func (o Op) IsWrite() bool { return o.F == Write || o.F == CAS || o.F == Add }

// WatchEvent is one event a watcher received.
type WatchEvent struct {
	Watcher int    `json:"watcher"`
	Session int    `json:"session"`
	Node    string `json:"node"`
	T       int64  `json:"t"`
	Key     string `json:"key"`
	Index   uint64 `json:"index"`
	Value   string `json:"value,omitempty"`
	Delete  bool   `json:"delete,omitempty"`
}

// WatchSession is one Watch stream of a watcher: it asked for every event
// with index > Start and, when it ended, had seen every event up to End.
// Continuity across sessions is the checker's business: a session that
// resumes sets Start to the previous session's End, a reload after
// compaction (Reload) breaks it on purpose.
type WatchSession struct {
	Watcher int    `json:"watcher"`
	Session int    `json:"session"`
	Node    string `json:"node"`
	Start   uint64 `json:"start"`
	End     uint64 `json:"end"`
	Reload  bool   `json:"reload,omitempty"`
	Began   int64  `json:"began"`
	Ended   int64  `json:"ended"`
	Reason  string `json:"reason,omitempty"`
}

// Fault is one nemesis window: from Start the fault was in force, at End it
// was healed.
type Fault struct {
	ID     int    `json:"id"`
	Kind   string `json:"kind"`
	Target string `json:"target,omitempty"`
	Detail string `json:"detail,omitempty"`
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
	// OldLeader is the leader's member id when the fault started (0 if
	// none was known); leader-affecting faults measure time to a new one.
	OldLeader uint64 `json:"old_leader,omitempty"`
	OldTerm   uint64 `json:"old_term,omitempty"`
	// LeaderFault is true when the fault took the leader out (killed,
	// paused or isolated it): the checker measures time to a new leader.
	LeaderFault bool   `json:"leader_fault,omitempty"`
	Err         string `json:"err,omitempty"`
	// Skipped is true when nothing was injected (e.g. the cluster was not
	// healthy enough for a membership change); such windows are not
	// counted as faults.
	Skipped bool `json:"skipped,omitempty"`
}

// LeaderObs is one Status answer of one node.
type LeaderObs struct {
	T      int64  `json:"t"`
	Node   string `json:"node"`
	Leader uint64 `json:"leader"`
	Term   uint64 `json:"term"`
}

// FinalState is what the harness read after the final heal.
type FinalState struct {
	// Index is the header index of the linearizable range that read KVs.
	Index uint64 `json:"index"`
	// KVs maps every workload key to its value and ModifyIndex.
	KVs map[string]FinalKV `json:"kvs"`
	// Replicas maps a node name to its stale read of every workload key
	// once it had applied Index; a missing map means the node could not
	// be read.
	Replicas map[string]map[string]FinalKV `json:"replicas,omitempty"`
	// Complete is false when the final read failed; the checkers that
	// need it then report that instead of anomalies.
	Complete bool   `json:"complete"`
	Err      string `json:"err,omitempty"`
}

// FinalKV is one key as read at the end.
type FinalKV struct {
	Value string `json:"value"`
	Index uint64 `json:"index"`
}

// History is everything one campaign recorded. Record* methods are safe
// for concurrent use; the slices must not be read while recording runs.
type History struct {
	mu      sync.Mutex
	start   time.Time
	seq     int64
	Ops     []Op           `json:"-"`
	Events  []WatchEvent   `json:"-"`
	Session []WatchSession `json:"-"`
	Faults  []Fault        `json:"-"`
	Leaders []LeaderObs    `json:"-"`
	Final   FinalState     `json:"-"`
	// Notes are facts the checkers should know (e.g. "watch: not served").
	Notes []string `json:"-"`
}

// New starts a history whose clock reads 0 now.
func New() *History { return &History{start: time.Now()} }

// Now is the campaign clock: nanoseconds since New.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Start is the wall-clock time of the campaign's 0.
func (h *History) Start() time.Time { return h.start }

// Invoke assigns op a sequence number and its call time; Complete records
// it once it returned.
func (h *History) Invoke(op *Op) {
	h.mu.Lock()
	h.seq++
	op.Seq = h.seq
	h.mu.Unlock()
	op.Call = h.Now()
}

// Complete stamps the return time and records op.
func (h *History) Complete(op Op) {
	op.Ret = h.Now()
	h.mu.Lock()
	h.Ops = append(h.Ops, op)
	h.mu.Unlock()
}

// RecordEvent, RecordSession, RecordFault, RecordLeader and Note append.
func (h *History) RecordEvent(e WatchEvent) {
	h.mu.Lock()
	h.Events = append(h.Events, e)
	h.mu.Unlock()
}

func (h *History) RecordSession(s WatchSession) {
	h.mu.Lock()
	h.Session = append(h.Session, s)
	h.mu.Unlock()
}

func (h *History) RecordFault(f Fault) {
	h.mu.Lock()
	h.Faults = append(h.Faults, f)
	h.mu.Unlock()
}

func (h *History) RecordLeader(o LeaderObs) {
	h.mu.Lock()
	h.Leaders = append(h.Leaders, o)
	h.mu.Unlock()
}

func (h *History) Note(format string, args ...any) {
	h.mu.Lock()
	h.Notes = append(h.Notes, fmt.Sprintf(format, args...))
	h.mu.Unlock()
}

// SetFinal records the final state.
func (h *History) SetFinal(f FinalState) {
	h.mu.Lock()
	h.Final = f
	h.mu.Unlock()
}

// Sort orders every record by time (ops by invocation), so files and
// checkers see one order whatever the goroutines' interleaving was.
func (h *History) Sort() {
	h.mu.Lock()
	defer h.mu.Unlock()
	sort.SliceStable(h.Ops, func(i, j int) bool { return h.Ops[i].Seq < h.Ops[j].Seq })
	sort.SliceStable(h.Events, func(i, j int) bool { return h.Events[i].T < h.Events[j].T })
	sort.SliceStable(h.Session, func(i, j int) bool { return h.Session[i].Began < h.Session[j].Began })
	sort.SliceStable(h.Faults, func(i, j int) bool { return h.Faults[i].Start < h.Faults[j].Start })
	sort.SliceStable(h.Leaders, func(i, j int) bool { return h.Leaders[i].T < h.Leaders[j].T })
}

// End is the time of the last recorded thing.
func (h *History) End() int64 {
	var end int64
	for _, o := range h.Ops {
		end = max(end, o.Ret)
	}
	for _, f := range h.Faults {
		end = max(end, f.End)
	}
	return end
}

// Infinity is the return time given to Info operations for the checkers:
// they may take effect at any time after their call.
const Infinity = math.MaxInt64 / 2

// File names inside a run directory.
const (
	OpsFile      = "history.jsonl"
	EventsFile   = "watch-events.jsonl"
	SessionsFile = "watch-sessions.jsonl"
	FaultsFile   = "faults.jsonl"
	LeadersFile  = "leaders.jsonl"
	FinalFile    = "final.json"
	NotesFile    = "notes.txt"
)

// Save writes the history into dir, one file per record kind.
func (h *History) Save(dir string) error {
	h.Sort()
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := writeLines(filepath.Join(dir, OpsFile), h.Ops); err != nil {
		return err
	}
	if err := writeLines(filepath.Join(dir, EventsFile), h.Events); err != nil {
		return err
	}
	if err := writeLines(filepath.Join(dir, SessionsFile), h.Session); err != nil {
		return err
	}
	if err := writeLines(filepath.Join(dir, FaultsFile), h.Faults); err != nil {
		return err
	}
	if err := writeLines(filepath.Join(dir, LeadersFile), h.Leaders); err != nil {
		return err
	}
	b, err := json.MarshalIndent(h.Final, "", "  ")
	if err != nil {
		return fmt.Errorf("encode final state: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, FinalFile), b, 0o644); err != nil {
		return fmt.Errorf("write final state: %w", err)
	}
	var notes []byte
	for _, n := range h.Notes {
		notes = append(notes, n...)
		notes = append(notes, '\n')
	}
	if err := os.WriteFile(filepath.Join(dir, NotesFile), notes, 0o644); err != nil {
		return fmt.Errorf("write notes: %w", err)
	}
	return nil
}

// Load reads a history that Save wrote.
func Load(dir string) (*History, error) {
	h := &History{}
	var err error
	if h.Ops, err = readLines[Op](filepath.Join(dir, OpsFile)); err != nil {
		return nil, err
	}
	if h.Events, err = readLines[WatchEvent](filepath.Join(dir, EventsFile)); err != nil {
		return nil, err
	}
	if h.Session, err = readLines[WatchSession](filepath.Join(dir, SessionsFile)); err != nil {
		return nil, err
	}
	if h.Faults, err = readLines[Fault](filepath.Join(dir, FaultsFile)); err != nil {
		return nil, err
	}
	if h.Leaders, err = readLines[LeaderObs](filepath.Join(dir, LeadersFile)); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, FinalFile))
	if err != nil {
		return nil, fmt.Errorf("read final state: %w", err)
	}
	if err := json.Unmarshal(b, &h.Final); err != nil {
		return nil, fmt.Errorf("decode final state: %w", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, NotesFile)); err == nil {
		for _, line := range splitLines(string(b)) {
			h.Notes = append(h.Notes, line)
		}
	}
	for _, o := range h.Ops {
		h.seq = max(h.seq, o.Seq)
	}
	return h, nil
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

func writeLines[T any](path string, recs []T) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", filepath.Base(path), err)
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for i := range recs {
		if err := enc.Encode(&recs[i]); err != nil {
			f.Close()
			return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", filepath.Base(path), err)
	}
	return nil
}

func readLines[T any](path string) ([]T, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", filepath.Base(path), err)
	}
	defer f.Close()
	var out []T
	dec := json.NewDecoder(bufio.NewReader(f))
	for {
		var rec T
		err := dec.Decode(&rec)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decode %s record %d: %w", filepath.Base(path), len(out)+1, err)
		}
		out = append(out, rec)
	}
}
