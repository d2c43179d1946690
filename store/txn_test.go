package store

import (
	"fmt"
	"slices"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

const (
	SET              = lodestonepb.TxnOp_SET
	GET              = lodestonepb.TxnOp_GET
	DELETE           = lodestonepb.TxnOp_DELETE
	DELETE_PREFIX    = lodestonepb.TxnOp_DELETE_PREFIX
	CAS              = lodestonepb.TxnOp_CAS
	CHECK_INDEX      = lodestonepb.TxnOp_CHECK_INDEX
	CHECK_NOT_EXISTS = lodestonepb.TxnOp_CHECK_NOT_EXISTS
	DELETE_CAS       = lodestonepb.TxnOp_DELETE_CAS
)

func fmtTxn(r *lodestonepb.TxnResponse) (results, errs []string) {
	for _, x := range r.GetResults() {
		s := fmtKV(x.GetKv())
		if x.GetDeleted() > 0 {
			s += fmt.Sprintf(" deleted=%d", x.GetDeleted())
		}
		results = append(results, s)
	}
	for _, e := range r.GetErrors() {
		errs = append(errs, fmt.Sprintf("%d: %s", e.GetOpIndex(), e.GetWhat()))
	}
	return results, errs
}

// Fixture for every txn case: a@1 (modified at 2), b@3, dir/1@4, dir/2@5.
// The txn itself applies at index 6.
func txnFixture(t *testing.T) *driver {
	d := newDriver(t)
	d.applyAll(putCmd("a", "a1"), putCmd("a", "a2"), putCmd("b", "b1"), putCmd("dir/1", "d1"), putCmd("dir/2", "d2"))
	return d
}

func TestTxn(t *testing.T) {
	fixtureKVs := dumpKVs(txnFixture(t).s)
	tests := []struct {
		name        string
		ops         []*lodestonepb.TxnOp
		wantOK      bool
		wantResults []string
		wantErrors  []string
		wantEvents  []string
		wantKeys    []string // after; nil: unchanged
	}{
		{
			name:        "sets share one ModifyIndex",
			ops:         []*lodestonepb.TxnOp{opSet("a", "x"), opSet("new", "y")},
			wantOK:      true,
			wantResults: []string{`a="" c=1 m=6 l=0 f=0 s=""`, `new="" c=6 m=6 l=0 f=0 s=""`},
			wantEvents:  []string{"put a=x c=1 m=6 prev.m=2", "put new=y c=6 m=6"},
			wantKeys:    []string{"a", "b", "dir/1", "dir/2", "new"},
		},
		{
			name:        "get sees earlier set",
			ops:         []*lodestonepb.TxnOp{opSet("n", "v"), op(GET, "n"), op(GET, "a"), op(GET, "missing")},
			wantOK:      true,
			wantResults: []string{`n="" c=6 m=6 l=0 f=0 s=""`, `n="v" c=6 m=6 l=0 f=0 s=""`, `a="a2" c=1 m=2 l=0 f=0 s=""`, `<nil>`},
			wantEvents:  []string{"put n=v c=6 m=6"},
			wantKeys:    []string{"a", "b", "dir/1", "dir/2", "n"},
		},
		{
			name:        "get after delete sees nothing",
			ops:         []*lodestonepb.TxnOp{op(DELETE, "a"), op(GET, "a")},
			wantOK:      true,
			wantResults: []string{`<nil> deleted=1`, `<nil>`},
			wantEvents:  []string{"delete a m=6 prev.m=2"},
			wantKeys:    []string{"b", "dir/1", "dir/2"},
		},
		{
			name:        "check sees earlier set",
			ops:         []*lodestonepb.TxnOp{opSet("n", "v"), opIdx(CHECK_INDEX, "n", 6), opCAS("n", "w", 6)},
			wantOK:      true,
			wantResults: []string{`n="" c=6 m=6 l=0 f=0 s=""`, `<nil>`, `n="" c=6 m=6 l=0 f=0 s=""`},
			wantEvents:  []string{"put n=w c=6 m=6"},
			wantKeys:    []string{"a", "b", "dir/1", "dir/2", "n"},
		},
		{
			name:        "check not exists sees earlier delete prefix",
			ops:         []*lodestonepb.TxnOp{op(DELETE_PREFIX, "dir/"), op(CHECK_NOT_EXISTS, "dir/1"), opCAS("dir/2", "back", 0)},
			wantOK:      true,
			wantResults: []string{`<nil> deleted=2`, `<nil>`, `dir/2="" c=6 m=6 l=0 f=0 s=""`},
			wantEvents:  []string{"delete dir/1 m=6 prev.m=4", "put dir/2=back c=6 m=6 prev.m=5"},
			wantKeys:    []string{"a", "b", "dir/2"},
		},
		{
			name:       "failing check at the end rolls back earlier sets and deletes",
			ops:        []*lodestonepb.TxnOp{opSet("a", "x"), opSet("new", "y"), op(DELETE, "b"), op(DELETE_PREFIX, "dir/"), opIdx(CHECK_INDEX, "a", 2)},
			wantErrors: []string{`4: key "a" ModifyIndex is 6, want 2`},
		},
		{
			name:       "every failing op is reported",
			ops:        []*lodestonepb.TxnOp{opIdx(CHECK_INDEX, "a", 1), opSet("x", "1"), op(CHECK_NOT_EXISTS, "b"), opIdx(CHECK_INDEX, "nope", 3)},
			wantErrors: []string{`0: key "a" ModifyIndex is 2, want 1`, `2: key "b" exists with ModifyIndex 3, want absent`, `3: key "nope" does not exist, want ModifyIndex 3`},
		},
		{
			name:       "cas create-only on existing key",
			ops:        []*lodestonepb.TxnOp{opCAS("b", "x", 0)},
			wantErrors: []string{`0: key "b" exists with ModifyIndex 3, want absent`},
		},
		{
			name:       "cas stale index",
			ops:        []*lodestonepb.TxnOp{opSet("z", "1"), opCAS("a", "x", 1)},
			wantErrors: []string{`1: key "a" ModifyIndex is 2, want 1`},
		},
		{
			name:        "cas matching",
			ops:         []*lodestonepb.TxnOp{opCAS("a", "x", 2)},
			wantOK:      true,
			wantResults: []string{`a="" c=1 m=6 l=0 f=0 s=""`},
			wantEvents:  []string{"put a=x c=1 m=6 prev.m=2"},
			wantKeys:    []string{"a", "b", "dir/1", "dir/2"},
		},
		{
			name:        "delete cas matching",
			ops:         []*lodestonepb.TxnOp{opIdx(DELETE_CAS, "b", 3)},
			wantOK:      true,
			wantResults: []string{`<nil> deleted=1`},
			wantEvents:  []string{"delete b m=6 prev.m=3"},
			wantKeys:    []string{"a", "dir/1", "dir/2"},
		},
		{
			name:       "delete cas mismatch",
			ops:        []*lodestonepb.TxnOp{op(DELETE, "a"), opIdx(DELETE_CAS, "b", 2)},
			wantErrors: []string{`1: key "b" ModifyIndex is 3, want 2`},
		},
		{
			name:        "delete cas 0 on missing key",
			ops:         []*lodestonepb.TxnOp{opIdx(DELETE_CAS, "nope", 0)},
			wantOK:      true,
			wantResults: []string{`<nil>`},
			wantKeys:    []string{"a", "b", "dir/1", "dir/2"},
		},
		{
			name:        "set twice yields one event with the final entry",
			ops:         []*lodestonepb.TxnOp{opSet("a", "x"), opSet("b", "y"), opSet("a", "z")},
			wantOK:      true,
			wantResults: []string{`a="" c=1 m=6 l=0 f=0 s=""`, `b="" c=3 m=6 l=0 f=0 s=""`, `a="" c=1 m=6 l=0 f=0 s=""`},
			wantEvents:  []string{"put a=z c=1 m=6 prev.m=2", "put b=y c=3 m=6 prev.m=3"},
			wantKeys:    []string{"a", "b", "dir/1", "dir/2"},
		},
		{
			name:        "create then delete of a new key yields no event",
			ops:         []*lodestonepb.TxnOp{opSet("tmp", "x"), op(DELETE, "tmp")},
			wantOK:      true,
			wantResults: []string{`tmp="" c=6 m=6 l=0 f=0 s=""`, `<nil> deleted=1`},
			wantKeys:    []string{"a", "b", "dir/1", "dir/2"},
		},
		{
			name:        "delete then set recreates with new CreateIndex",
			ops:         []*lodestonepb.TxnOp{op(DELETE, "a"), opSet("a", "again")},
			wantOK:      true,
			wantResults: []string{`<nil> deleted=1`, `a="" c=6 m=6 l=0 f=0 s=""`},
			wantEvents:  []string{"put a=again c=6 m=6 prev.m=2"},
			wantKeys:    []string{"a", "b", "dir/1", "dir/2"},
		},
		{
			name:       "malformed op runs nothing",
			ops:        []*lodestonepb.TxnOp{opSet("a", "x"), op(lodestonepb.TxnOp_Verb(42), "b"), op(SET, "")},
			wantErrors: []string{`1: unknown verb 42; want SET, GET, DELETE, DELETE_PREFIX, CAS, CHECK_INDEX, CHECK_NOT_EXISTS, DELETE_CAS, LOCK, UNLOCK or CHECK_SESSION`, `2: key must not be empty`},
		},
		{
			name:       "nil op runs nothing",
			ops:        []*lodestonepb.TxnOp{opSet("a", "x"), nil},
			wantErrors: []string{`1: operation is empty`},
		},
		{
			name:       "empty transaction",
			ops:        nil,
			wantErrors: []string{`0: transaction has no operations`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := txnFixture(t)
			res, evs := d.apply(txnCmd(tt.ops...))
			r := res.GetTxn()
			if r == nil {
				t.Fatalf("result %v has no TxnResponse", res)
			}
			if got, want := r.GetSucceeded(), tt.wantOK; got != want {
				t.Errorf("succeeded = %v, want %v", got, want)
			}
			gotRes, gotErr := fmtTxn(r)
			if got, want := gotRes, tt.wantResults; !slices.Equal(got, want) {
				t.Errorf("results =\n%q\nwant\n%q", got, want)
			}
			if got, want := gotErr, tt.wantErrors; !slices.Equal(got, want) {
				t.Errorf("errors =\n%q\nwant\n%q", got, want)
			}
			if got, want := fmtEvents(evs), tt.wantEvents; !slices.Equal(got, want) {
				t.Errorf("events =\n%q\nwant\n%q", got, want)
			}
			if res.GetCasFailed() {
				t.Errorf("cas_failed set on a txn result")
			}
			if !tt.wantOK {
				if got, want := dumpKVs(d.s), fixtureKVs; got != want {
					t.Errorf("failed txn changed state:\n%s\nwant\n%s", got, want)
				}
				if got, want := d.s.KVIndex(), uint64(5); got != want {
					t.Errorf("KVIndex = %d, want %d", got, want)
				}
				return
			}
			kvs, _, _ := d.s.Range(nil, nil, 0, true)
			if got, want := keysOf(kvs), tt.wantKeys; !slices.Equal(got, want) {
				t.Errorf("keys after = %q, want %q", got, want)
			}
		})
	}
}

// A rolled-back transaction must not disturb a snapshot taken before it,
// and must leave the encoding of the store byte-identical (apart from the
// applied index).
func TestTxnRollbackIsExact(t *testing.T) {
	d := txnFixture(t)
	for i := 0; i < 200; i++ {
		d.apply(putCmd(fmt.Sprintf("bulk/%03d", i), "v"))
	}
	before := encode(t, d.s)
	sn := d.s.Snapshot()
	res, _ := d.apply(txnCmd(op(DELETE_PREFIX, "bulk/"), opSet("bulk/050", "x"), opSet("zzz", "1"), op(CHECK_NOT_EXISTS, "a")))
	if res.GetTxn().GetSucceeded() {
		t.Fatalf("txn succeeded, want failure")
	}
	after := New()
	if err := after.Restore(bytesReader(encode(t, d.s))); err != nil {
		t.Fatal(err)
	}
	restoredBefore := New()
	if err := restoredBefore.Restore(bytesReader(before)); err != nil {
		t.Fatal(err)
	}
	if got, want := dumpKVs(after), dumpKVs(restoredBefore); got != want {
		t.Errorf("rolled-back state differs from before")
	}
	var buf writerBuf
	if _, err := sn.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if string(buf.b) != string(before) {
		t.Errorf("snapshot taken before the txn changed")
	}
}
