package store

import (
	"fmt"
	"slices"
	"testing"
	"unsafe"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

func TestPutGet(t *testing.T) {
	tests := []struct {
		name string
		cmds []*lodestonepb.Command // applied at 1, 2, ...
		key  string
		want string // fmtKV of the entry
	}{
		{"missing key", nil, "a", "<nil>"},
		{"create", []*lodestonepb.Command{putCmd("a", "1")}, "a", `a="1" c=1 m=1 l=0 f=0 s=""`},
		{"overwrite keeps CreateIndex", []*lodestonepb.Command{putCmd("a", "1"), putCmd("b", "x"), putCmd("a", "2")}, "a", `a="2" c=1 m=3 l=0 f=0 s=""`},
		{"flags set and replaced", []*lodestonepb.Command{putFlags("a", "1", 42), putCmd("a", "2")}, "a", `a="2" c=1 m=2 l=0 f=0 s=""`},
		{"flags kept when given", []*lodestonepb.Command{putFlags("a", "1", 7)}, "a", `a="1" c=1 m=1 l=0 f=7 s=""`},
		{"empty value", []*lodestonepb.Command{putCmd("a", "")}, "a", `a="" c=1 m=1 l=0 f=0 s=""`},
		{"recreate after delete gets new CreateIndex", []*lodestonepb.Command{putCmd("a", "1"), delCmd("a"), putCmd("a", "3")}, "a", `a="3" c=3 m=3 l=0 f=0 s=""`},
		{"binary key", []*lodestonepb.Command{putCmd("\xff\x01", "v")}, "\xff\x01", "\xff\x01=\"v\" c=1 m=1 l=0 f=0 s=\"\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDriver(t)
			d.applyAll(tt.cmds...)
			kv, idx := d.s.Get([]byte(tt.key))
			if got, want := fmtKV(kv), tt.want; got != want {
				t.Errorf("Get(%q) = %s, want %s", tt.key, got, want)
			}
			if got, want := idx, uint64(len(tt.cmds)); got != want {
				t.Errorf("Get index = %d, want %d", got, want)
			}
		})
	}
}

func TestPutPreservesLockAndSession(t *testing.T) {
	s := New()
	s.Apply(1, putCmd("a", "1"))
	// Sessions are not implemented yet; plant a locked entry directly.
	s.mu.Lock()
	it, _ := s.kv.Get(probe([]byte("a")))
	locked := *it.r
	locked.lock = &lockState{index: 3, session: "sess-1"}
	s.kv.ReplaceOrInsert(keep(it.key(), &locked))
	s.mu.Unlock()

	res, _ := s.Apply(2, putCmd("a", "2"))
	got, _ := s.Get([]byte("a"))
	if got, want := fmtKV(got), `a="2" c=1 m=2 l=3 f=0 s="sess-1"`; got != want {
		t.Errorf("after put: %s, want %s", got, want)
	}
	if got, want := fmtKV(res.GetPut().GetKv()), `a="" c=1 m=2 l=3 f=0 s="sess-1"`; got != want {
		t.Errorf("PutResponse.kv = %s, want %s (value omitted)", got, want)
	}
}

// TestApplyKeepsCommandKey pins Apply's contract: the entry stored keeps
// the command's own key, not a copy; the value goes to the value file, and
// the event carries the command's value itself.
func TestApplyKeepsCommandKey(t *testing.T) {
	s := New()
	cmd := putCmd("key", "value")
	_, evs := s.Apply(1, cmd)
	kv, _ := s.Get([]byte("key"))
	if unsafe.SliceData(kv.GetKey()) != unsafe.SliceData(cmd.GetPut().Key) {
		t.Errorf("stored entry %s holds a copy of the command's key", fmtKV(kv))
	}
	if unsafe.SliceData(kv.GetValue()) == unsafe.SliceData(cmd.GetPut().Value) || string(kv.GetValue()) != "value" {
		t.Errorf("a read returned %q from the command's own value, not the value file", kv.GetValue())
	}
	if len(evs) != 1 || unsafe.SliceData(evs[0].KV.GetValue()) != unsafe.SliceData(cmd.GetPut().Value) {
		t.Errorf("the put event does not carry the command's value: %v", evs)
	}
}

func rangeFixture(t *testing.T) *Store {
	d := newDriver(t)
	for _, k := range []string{"a", "app/1", "app/2", "app/3", "app/4", "apple", "b/x", "b/y", "c"} {
		d.apply(putCmd(k, "v-"+k))
	}
	return d.s
}

func TestRange(t *testing.T) {
	s := rangeFixture(t)
	tests := []struct {
		name       string
		prefix     string
		startAfter string
		limit      int
		keysOnly   bool
		want       []string
		wantMore   bool
	}{
		{name: "everything", want: []string{"a", "app/1", "app/2", "app/3", "app/4", "apple", "b/x", "b/y", "c"}},
		{name: "prefix", prefix: "app/", want: []string{"app/1", "app/2", "app/3", "app/4"}},
		{name: "prefix is also a key", prefix: "a", want: []string{"a", "app/1", "app/2", "app/3", "app/4", "apple"}},
		{name: "prefix matches nothing", prefix: "zz", want: []string{}},
		{name: "prefix between keys", prefix: "ap", want: []string{"app/1", "app/2", "app/3", "app/4", "apple"}},
		{name: "limit cuts, more", prefix: "app/", limit: 2, want: []string{"app/1", "app/2"}, wantMore: true},
		{name: "limit exact, no more", prefix: "app/", limit: 4, want: []string{"app/1", "app/2", "app/3", "app/4"}},
		{name: "limit above count", prefix: "b/", limit: 10, want: []string{"b/x", "b/y"}},
		{name: "start_after pages", prefix: "app/", startAfter: "app/2", limit: 1, want: []string{"app/3"}, wantMore: true},
		{name: "start_after last page", prefix: "app/", startAfter: "app/3", limit: 2, want: []string{"app/4"}},
		{name: "start_after not a key", prefix: "app/", startAfter: "app/25", want: []string{"app/3", "app/4"}},
		{name: "start_after before prefix", prefix: "b/", startAfter: "a", want: []string{"b/x", "b/y"}},
		{name: "start_after past prefix", prefix: "app/", startAfter: "b", want: []string{}},
		{name: "start_after last key", startAfter: "c", want: []string{}},
		{name: "start_after without prefix", startAfter: "apple", limit: 2, want: []string{"b/x", "b/y"}, wantMore: true},
		{name: "keys only", prefix: "b/", keysOnly: true, want: []string{"b/x", "b/y"}},
		{name: "negative limit is no cap", prefix: "b/", limit: -1, want: []string{"b/x", "b/y"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sa []byte
			if tt.startAfter != "" {
				sa = []byte(tt.startAfter)
			}
			kvs, more, idx := s.Range([]byte(tt.prefix), sa, tt.limit, tt.keysOnly)
			if got, want := keysOf(kvs), tt.want; !slices.Equal(got, want) {
				t.Errorf("keys = %q, want %q", got, want)
			}
			if got, want := more, tt.wantMore; got != want {
				t.Errorf("more = %v, want %v", got, want)
			}
			if got, want := idx, uint64(9); got != want {
				t.Errorf("index = %d, want %d", got, want)
			}
			for _, kv := range kvs {
				if got, want := len(kv.Value) == 0, tt.keysOnly; got != want {
					t.Errorf("key %q: value empty = %v, want %v", kv.Key, got, want)
				}
				if kv.CreateIndex == 0 || kv.ModifyIndex == 0 {
					t.Errorf("key %q: indices missing: %s", kv.Key, fmtKV(kv))
				}
			}
		})
	}
}

// TestRangePagingTwoWays checks the same answer two ways: paging with
// start_after and every limit from 1 to n+1 yields exactly the unpaged
// answer.
func TestRangePagingTwoWays(t *testing.T) {
	s := rangeFixture(t)
	all, more, _ := s.Range([]byte("a"), nil, 0, false)
	if more {
		t.Fatalf("unlimited range says more")
	}
	for limit := 1; limit <= len(all)+1; limit++ {
		var got []string
		var after []byte
		for pages := 0; ; pages++ {
			if pages > len(all)+1 {
				t.Fatalf("limit %d: paging does not end", limit)
			}
			kvs, more, _ := s.Range([]byte("a"), after, limit, true)
			got = append(got, keysOf(kvs)...)
			if !more {
				break
			}
			after = kvs[len(kvs)-1].Key
		}
		if want := keysOf(all); !slices.Equal(got, want) {
			t.Errorf("limit %d: paged keys %q, want %q", limit, got, want)
		}
	}
}

func TestDelete(t *testing.T) {
	base := []string{"a", "ab", "abc", "b", "b/1"}
	tests := []struct {
		name        string
		cmd         *lodestonepb.Command
		wantDeleted uint64
		wantCAS     bool
		wantKeys    []string
		wantEvents  []string
	}{
		{"one key", delCmd("ab"), 1, false, []string{"a", "abc", "b", "b/1"}, []string{"delete ab m=6 prev.m=2"}},
		{"missing key is not an error", delCmd("zz"), 0, false, base, nil},
		{"key is not a prefix", delCmd("a"), 1, false, []string{"ab", "abc", "b", "b/1"}, []string{"delete a m=6 prev.m=1"}},
		{"prefix", delPrefix("a"), 3, false, []string{"b", "b/1"}, []string{"delete a m=6 prev.m=1", "delete ab m=6 prev.m=2", "delete abc m=6 prev.m=3"}},
		{"prefix matching nothing", delPrefix("zz"), 0, false, base, nil},
		{"prefix with slash", delPrefix("b/"), 1, false, []string{"a", "ab", "abc", "b"}, []string{"delete b/1 m=6 prev.m=5"}},
		{"cas match", delCAS("b", 4), 1, false, []string{"a", "ab", "abc", "b/1"}, []string{"delete b m=6 prev.m=4"}},
		{"cas mismatch leaves key", delCAS("b", 3), 0, true, base, nil},
		{"cas on missing key", delCAS("zz", 3), 0, true, base, nil},
		{"cas 0 on missing key", delCAS("zz", 0), 0, false, base, nil},
		{"cas 0 on existing key", delCAS("b", 0), 0, true, base, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDriver(t)
			for _, k := range base {
				d.apply(putCmd(k, k))
			}
			before := dumpKVs(d.s)
			res, evs := d.apply(tt.cmd)
			if res.GetDelete() == nil {
				t.Fatalf("result %v has no DeleteResponse", res)
			}
			if got, want := res.GetDelete().GetDeleted(), tt.wantDeleted; got != want {
				t.Errorf("deleted = %d, want %d", got, want)
			}
			if got, want := res.GetCasFailed(), tt.wantCAS; got != want {
				t.Errorf("cas_failed = %v, want %v", got, want)
			}
			kvs, _, _ := d.s.Range(nil, nil, 0, true)
			if got, want := keysOf(kvs), tt.wantKeys; !slices.Equal(got, want) {
				t.Errorf("keys after = %q, want %q", got, want)
			}
			if got, want := fmtEvents(evs), tt.wantEvents; !slices.Equal(got, want) {
				t.Errorf("events = %q, want %q", got, want)
			}
			if tt.wantDeleted == 0 {
				if got, want := dumpKVs(d.s), before; got != want {
					t.Errorf("state changed by a delete that removed nothing:\n%s\nwant\n%s", got, want)
				}
				if got, want := d.s.KVIndex(), uint64(5); got != want {
					t.Errorf("KVIndex = %d, want %d (nothing changed)", got, want)
				}
			}
		})
	}
}

func fmtEvents(evs []Event) []string {
	var out []string
	for _, e := range evs {
		s := fmt.Sprintf("%s %s m=%d", e.Type, e.KV.Key, e.KV.ModifyIndex)
		if e.Type == EventPut {
			s = fmt.Sprintf("%s %s=%s c=%d m=%d", e.Type, e.KV.Key, e.KV.Value, e.KV.CreateIndex, e.KV.ModifyIndex)
		}
		if e.PrevKV != nil {
			s += fmt.Sprintf(" prev.m=%d", e.PrevKV.ModifyIndex)
		}
		out = append(out, s)
	}
	return out
}

func TestPutCAS(t *testing.T) {
	// Fixture: a created at 1, modified at 2; b created at 3.
	fixture := []*lodestonepb.Command{putCmd("a", "1"), putCmd("a", "2"), putCmd("b", "1")}
	tests := []struct {
		name     string
		cmd      *lodestonepb.Command
		wantCAS  bool
		wantKV   string // PutResponse.kv, value omitted
		wantA    string // a after
		wantNone bool   // no events
	}{
		{"create-only on missing key", putCAS("c", "new", 0), false, `c="" c=4 m=4 l=0 f=0 s=""`, `a="2" c=1 m=2 l=0 f=0 s=""`, false},
		{"create-only on existing key", putCAS("a", "new", 0), true, `a="" c=1 m=2 l=0 f=0 s=""`, `a="2" c=1 m=2 l=0 f=0 s=""`, true},
		{"matching ModifyIndex", putCAS("a", "new", 2), false, `a="" c=1 m=4 l=0 f=0 s=""`, `a="new" c=1 m=4 l=0 f=0 s=""`, false},
		{"stale ModifyIndex", putCAS("a", "new", 1), true, `a="" c=1 m=2 l=0 f=0 s=""`, `a="2" c=1 m=2 l=0 f=0 s=""`, true},
		{"CreateIndex is not ModifyIndex", putCAS("b", "new", 1), true, `b="" c=3 m=3 l=0 f=0 s=""`, `a="2" c=1 m=2 l=0 f=0 s=""`, true},
		{"index on missing key", putCAS("zz", "new", 2), true, `<nil>`, `a="2" c=1 m=2 l=0 f=0 s=""`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDriver(t)
			d.applyAll(fixture...)
			before := encode(t, d.s)
			res, evs := d.apply(tt.cmd)
			if got, want := res.GetCasFailed(), tt.wantCAS; got != want {
				t.Errorf("cas_failed = %v, want %v", got, want)
			}
			if got, want := fmtKV(res.GetPut().GetKv()), tt.wantKV; got != want {
				t.Errorf("PutResponse.kv = %s, want %s", got, want)
			}
			a, _ := d.s.Get([]byte("a"))
			if got, want := fmtKV(a), tt.wantA; got != want {
				t.Errorf("a after = %s, want %s", got, want)
			}
			if got, want := len(evs) == 0, tt.wantNone; got != want {
				t.Errorf("no events = %v, want %v (%q)", got, want, fmtEvents(evs))
			}
			if tt.wantCAS {
				// Nothing but the applied index may change.
				d.s.mu.Lock()
				d.s.index--
				d.s.mu.Unlock()
				if got, want := encode(t, d.s), before; string(got) != string(want) {
					t.Errorf("failed cas changed the state")
				}
			}
		})
	}
}

func TestPutEvents(t *testing.T) {
	d := newDriver(t)
	_, evs := d.apply(putCmd("a", "1"))
	if got, want := fmtEvents(evs), []string{"put a=1 c=1 m=1"}; !slices.Equal(got, want) {
		t.Errorf("create events = %q, want %q", got, want)
	}
	_, evs = d.apply(putCmd("a", "2"))
	if got, want := fmtEvents(evs), []string{"put a=2 c=1 m=2 prev.m=1"}; !slices.Equal(got, want) {
		t.Errorf("overwrite events = %q, want %q", got, want)
	}
	stored, _ := d.s.Get([]byte("a"))
	if !proto.Equal(evs[0].KV, stored) {
		t.Errorf("event KV %s is not the stored entry %s", fmtKV(evs[0].KV), fmtKV(stored))
	}
}

func TestIndex(t *testing.T) {
	s := New()
	steps := []struct {
		name        string
		do          func() (*lodestonepb.CommandResult, []Event)
		wantIndex   uint64
		wantKVIndex uint64
		wantNilRes  bool
		wantA       string
	}{
		{"put at 5", func() (*lodestonepb.CommandResult, []Event) { return s.Apply(5, putCmd("a", "1")) }, 5, 5, false, "1"},
		{"replay of 5 is a no-op", func() (*lodestonepb.CommandResult, []Event) { return s.Apply(5, putCmd("a", "replayed")) }, 5, 5, true, "1"},
		{"older index is a no-op", func() (*lodestonepb.CommandResult, []Event) { return s.Apply(3, delCmd("a")) }, 5, 5, true, "1"},
		{"advance to 7", func() (*lodestonepb.CommandResult, []Event) { s.Advance(7); return nil, nil }, 7, 5, true, "1"},
		{"advance backwards ignored", func() (*lodestonepb.CommandResult, []Event) { s.Advance(6); return nil, nil }, 7, 5, true, "1"},
		{"put at 7 after advance is a replay", func() (*lodestonepb.CommandResult, []Event) { return s.Apply(7, putCmd("a", "x")) }, 7, 5, true, "1"},
		{"gap is fine", func() (*lodestonepb.CommandResult, []Event) { return s.Apply(10, putCmd("a", "2")) }, 10, 10, false, "2"},
		{"no-op delete moves index, not KVIndex", func() (*lodestonepb.CommandResult, []Event) { return s.Apply(11, delCmd("zz")) }, 11, 10, false, "2"},
		{"malformed command moves index", func() (*lodestonepb.CommandResult, []Event) { return s.Apply(12, &lodestonepb.Command{}) }, 12, 10, false, "2"},
	}
	for _, st := range steps {
		res, evs := st.do()
		if got, want := res == nil, st.wantNilRes; got != want {
			t.Errorf("%s: nil result = %v, want %v", st.name, got, want)
		}
		if st.wantNilRes && len(evs) != 0 {
			t.Errorf("%s: events %q from a no-op", st.name, fmtEvents(evs))
		}
		if got, want := s.Index(), st.wantIndex; got != want {
			t.Errorf("%s: Index = %d, want %d", st.name, got, want)
		}
		if got, want := s.KVIndex(), st.wantKVIndex; got != want {
			t.Errorf("%s: KVIndex = %d, want %d", st.name, got, want)
		}
		a, _ := s.Get([]byte("a"))
		if got, want := string(a.GetValue()), st.wantA; got != want {
			t.Errorf("%s: a = %q, want %q", st.name, got, want)
		}
		checkInvariants(t, s)
	}
}

func TestMembers(t *testing.T) {
	s := New()
	m := func(id uint64, name string) *lodestonepb.Member {
		return &lodestonepb.Member{Id: id, Name: name, PeerAddr: name + ":7401"}
	}
	steps := []struct {
		name      string
		do        func()
		wantIDs   []uint64
		wantIndex uint64
		wantMIdx  uint64
	}{
		{"add 3", func() { s.SetMember(1, m(3, "n3")) }, []uint64{3}, 1, 1},
		{"same index adds another", func() { s.SetMember(1, m(1, "n1")) }, []uint64{1, 3}, 1, 1},
		{"add 2", func() { s.SetMember(2, m(2, "n2")) }, []uint64{1, 2, 3}, 2, 2},
		{"update 2", func() { s.SetMember(4, m(2, "n2b")) }, []uint64{1, 2, 3}, 4, 4},
		{"replay below index ignored", func() { s.RemoveMember(3, 1) }, []uint64{1, 2, 3}, 4, 4},
		{"remove 1", func() { s.RemoveMember(5, 1) }, []uint64{2, 3}, 5, 5},
		{"remove unknown moves index only", func() { s.RemoveMember(6, 99) }, []uint64{2, 3}, 6, 5},
		{"id 0 ignored", func() { s.SetMember(7, &lodestonepb.Member{Name: "zero"}) }, []uint64{2, 3}, 7, 5},
		{"nil ignored", func() { s.SetMember(8, nil) }, []uint64{2, 3}, 8, 5},
	}
	for _, st := range steps {
		st.do()
		var ids []uint64
		for _, x := range s.Members() {
			ids = append(ids, x.Id)
		}
		if got, want := ids, st.wantIDs; !slices.Equal(got, want) {
			t.Errorf("%s: ids = %v, want %v", st.name, got, want)
		}
		if got, want := s.Index(), st.wantIndex; got != want {
			t.Errorf("%s: Index = %d, want %d", st.name, got, want)
		}
		if got, want := s.MembersIndex(), st.wantMIdx; got != want {
			t.Errorf("%s: MembersIndex = %d, want %d", st.name, got, want)
		}
		checkInvariants(t, s)
	}
	if got, want := s.Members()[0].Name, "n2b"; got != want {
		t.Errorf("member 2 name = %q, want %q", got, want)
	}
	// PeerAddr follows the same updates and removals.
	for id, want := range map[uint64]string{2: "n2b:7401", 3: "n3:7401", 1: "", 99: ""} {
		if got := s.PeerAddr(id); got != want {
			t.Errorf("PeerAddr(%d) = %q, want %q", id, got, want)
		}
	}
	// Members returns copies; SetMember keeps its own copy.
	s.Members()[0].Name = "mutated"
	in := m(9, "n9")
	s.SetMember(9, in)
	in.Name = "mutated"
	for _, x := range s.Members() {
		if x.Name == "mutated" {
			t.Errorf("member %d aliased caller memory", x.Id)
		}
	}
}
