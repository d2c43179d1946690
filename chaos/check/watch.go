package check

import (
	"fmt"
	"sort"
	"strings"

	"github.com/lodestone-kv/lodestone/chaos/history"
)

type keyIndex struct {
	key   string
	index uint64
}

// Watch checks every watcher's streams against the committed history
// (docs/architecture.md, "Watches have no gaps, no duplicates and no
// reordering": per key no gaps, no duplicates, no reordering, resume
// continuity across leader changes; watch.proto: "Responses for one watch
// come in index order", "start_index delivers every matching event with
// index > start_index").
//
// The committed history per key is the union of what is known committed:
// acknowledged writes (their ModifyIndex), events any watcher received,
// and the final read. Two sources that disagree on one (key, index), or
// two keys claiming one index, are anomalies themselves.
//
// A watcher is a sequence of sessions (streams). Session s covers (Start,
// End]: it asked for events after Start and had seen, by its last response
// index, every event up to End. A session that resumes must start where
// the previous one ended; a Reload (after compaction) may skip ahead. Every
// committed event inside a covered interval must have arrived exactly once,
// in index order, with the committed value.
func Watch(h *history.History) Result {
	const name = "watch"
	if len(h.Session) == 0 {
		return Result{Checker: name, Status: Skipped, Summary: "no watch sessions recorded " + strings.Join(h.Notes, "; ")}
	}
	var anomalies []Anomaly
	add := func(key, format string, args ...any) {
		anomalies = append(anomalies, Anomaly{Checker: name, Key: key, What: fmt.Sprintf(format, args...)})
	}

	// The committed history.
	truth := map[keyIndex]string{}
	owner := map[uint64]string{}
	learn := func(key string, index uint64, value, source string) {
		if index == 0 || !strings.HasPrefix(key, Prefix) {
			return
		}
		if k, ok := owner[index]; ok && k != key {
			add(key, "index %d belongs to key %s and to key %s (%s)", index, k, key, source)
			return
		}
		owner[index] = key
		ki := keyIndex{key, index}
		if v, ok := truth[ki]; ok && v != value {
			add(key, "index %d has value %q and %q (%s)", index, v, value, source)
			return
		}
		truth[ki] = value
	}
	for _, o := range h.Ops {
		if o.IsWrite() && o.Type == history.OK {
			learn(o.Key, o.Index, o.Value, fmt.Sprintf("acknowledged op %d", o.Seq))
		}
	}
	for _, e := range h.Events {
		if !e.Delete {
			learn(e.Key, e.Index, e.Value, fmt.Sprintf("watcher %d session %d", e.Watcher, e.Session))
		}
	}
	if h.Final.Complete {
		for k, kv := range h.Final.KVs {
			learn(k, kv.Index, kv.Value, "final read")
		}
	}
	byKeyTruth := map[string][]uint64{}
	for ki := range truth {
		byKeyTruth[ki.key] = append(byKeyTruth[ki.key], ki.index)
	}
	for k := range byKeyTruth {
		sort.Slice(byKeyTruth[k], func(i, j int) bool { return byKeyTruth[k][i] < byKeyTruth[k][j] })
	}

	// Per watcher.
	sessions := map[int][]history.WatchSession{}
	for _, s := range h.Session {
		sessions[s.Watcher] = append(sessions[s.Watcher], s)
	}
	events := map[[2]int][]history.WatchEvent{}
	for _, e := range h.Events {
		id := [2]int{e.Watcher, e.Session}
		events[id] = append(events[id], e)
	}
	watchers := make([]int, 0, len(sessions))
	for w := range sessions {
		watchers = append(watchers, w)
	}
	sort.Ints(watchers)
	delivered, resumes, reloads := 0, 0, 0
	for _, w := range watchers {
		ss := sessions[w]
		sort.Slice(ss, func(i, j int) bool { return ss[i].Session < ss[j].Session })
		seen := map[keyIndex]bool{}
		lastOfKey := map[string]uint64{}
		type span struct{ lo, hi uint64 } // (lo, hi]
		var cover []span
		for i, s := range ss {
			if i > 0 {
				if s.Reload {
					reloads++
				} else {
					resumes++
					if prev := ss[i-1]; s.Start != prev.End {
						add("", "watcher %d session %d resumed at %d, but session %d ended at %d", w, s.Session, s.Start, prev.Session, prev.End)
					}
				}
			}
			if s.End > s.Start {
				cover = append(cover, span{s.Start, s.End})
			}
			last := s.Start
			for _, e := range events[[2]int{w, s.Session}] {
				delivered++
				ki := keyIndex{e.Key, e.Index}
				switch {
				case e.Index <= s.Start:
					add(e.Key, "watcher %d session %d (from %s, start %d) delivered index %d, at or before its start", w, s.Session, s.Node, s.Start, e.Index)
				case seen[ki]:
					add(e.Key, "watcher %d delivered index %d twice (again in session %d from %s)", w, e.Index, s.Session, s.Node)
				case e.Index < last:
					add(e.Key, "watcher %d session %d delivered index %d after index %d (out of order)", w, s.Session, e.Index, last)
				case lastOfKey[e.Key] >= e.Index:
					add(e.Key, "watcher %d delivered index %d after index %d of the same key", w, e.Index, lastOfKey[e.Key])
				}
				if e.Index > s.End {
					add(e.Key, "watcher %d session %d delivered index %d past its reported end %d", w, s.Session, e.Index, s.End)
				}
				if v, ok := truth[ki]; ok && !e.Delete && v != e.Value {
					add(e.Key, "watcher %d got %q at index %d, committed value is %q", w, e.Value, e.Index, v)
				}
				seen[ki] = true
				last = max(last, e.Index)
				lastOfKey[e.Key] = max(lastOfKey[e.Key], e.Index)
			}
		}
		// Gaps: committed events inside covered intervals that never came.
		sort.Slice(cover, func(i, j int) bool { return cover[i].lo < cover[j].lo })
		var merged []span
		for _, c := range cover {
			if n := len(merged); n > 0 && c.lo <= merged[n-1].hi {
				merged[n-1].hi = max(merged[n-1].hi, c.hi)
				continue
			}
			merged = append(merged, c)
		}
		covered := func(idx uint64) bool {
			// The last interval starting before idx is the only candidate.
			i := sort.Search(len(merged), func(i int) bool { return merged[i].lo >= idx })
			return i > 0 && idx <= merged[i-1].hi
		}
		keys := make([]string, 0, len(byKeyTruth))
		for k := range byKeyTruth {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			var missing []uint64
			for _, idx := range byKeyTruth[k] {
				if covered(idx) && !seen[keyIndex{k, idx}] {
					missing = append(missing, idx)
				}
			}
			if len(missing) > 0 {
				add(k, "watcher %d missed %d committed events inside its covered range, e.g. index %v", w, len(missing), firstNIdx(missing, 5))
			}
		}
	}
	summary := fmt.Sprintf("%d watchers, %d sessions (%d resumes, %d reloads), %d events delivered, %d committed events known", len(watchers), len(h.Session), resumes, reloads, delivered, len(truth))
	return verdict(name, anomalies, false, summary)
}

func firstNIdx(s []uint64, n int) []uint64 {
	if len(s) > n {
		return s[:n]
	}
	return s
}
