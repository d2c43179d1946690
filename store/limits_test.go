package store

import (
	"errors"
	"strings"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

func TestValidateCommand(t *testing.T) {
	l := DefaultLimits()
	big := strings.Repeat("k", 3000)
	ops := func(n int) []*lodestonepb.TxnOp {
		out := make([]*lodestonepb.TxnOp, n)
		for i := range out {
			out[i] = opSet("k", "v")
		}
		return out
	}
	withValue := func(o *lodestonepb.TxnOp, v string) *lodestonepb.TxnOp { o.Value = []byte(v); return o }
	withFlags := func(o *lodestonepb.TxnOp, f uint64) *lodestonepb.TxnOp { o.Flags = f; return o }
	tests := []struct {
		name     string
		limits   Limits
		cmd      *lodestonepb.Command
		wantRule string // "" means valid
		wantMsg  string
		wantOp   int
	}{
		{name: "put ok", cmd: putCmd("a", "b")},
		{name: "put key at limit", cmd: putCmd(strings.Repeat("k", 2048), "")},
		{name: "put value at limit", cmd: putCmd("a", strings.Repeat("v", 512<<10))},
		{name: "nil command", cmd: nil, wantRule: RuleCommandOp, wantMsg: "command has no operation; want put, delete, txn, or a catalog or session command"},
		{name: "no operation", cmd: &lodestonepb.Command{}, wantRule: RuleCommandOp, wantMsg: "command has no operation; want put, delete, txn, or a catalog or session command"},
		{name: "put without request", cmd: &lodestonepb.Command{Op: &lodestonepb.Command_Put{}}, wantRule: RuleCommandOp, wantMsg: "put command has no request"},
		{name: "delete without request", cmd: &lodestonepb.Command{Op: &lodestonepb.Command_Delete{}}, wantRule: RuleCommandOp, wantMsg: "delete command has no request"},
		{name: "empty key", cmd: putCmd("", "v"), wantRule: RuleKeyNonEmpty, wantMsg: "key must not be empty"},
		{name: "NUL in key", cmd: putCmd("ab\x00c", "v"), wantRule: RuleKeyNoNUL, wantMsg: "key must not contain a NUL byte (found at byte 2)"},
		{name: "put key not UTF-8", cmd: putCmd("ab\xffc", "v"), wantRule: RuleKeyUTF8,
			wantMsg: "key must be valid UTF-8 (invalid byte 0xff at byte 2); keys are listed as text, so a key that is not could not be addressed back"},
		{name: "put key UTF-8 multibyte ok", cmd: putCmd("caf\u00e9/\u65e5\u672c", "v")},
		{name: "txn set key not UTF-8", cmd: txnCmd(opSet("ok", ""), opSet("\xc3(", "v")), wantRule: RuleKeyUTF8, wantOp: 1,
			wantMsg: "txn op 1: key must be valid UTF-8 (invalid byte 0xc3 at byte 0); keys are listed as text, so a key that is not could not be addressed back"},
		{name: "delete and get of a non-UTF-8 key stored by an older version", cmd: txnCmd(op(GET, "\xff"), op(DELETE, "\xff"))},
		{name: "delete non-UTF-8 key", cmd: delCmd("\xff")},
		{name: "key too long", cmd: putCmd(big, "v"), wantRule: RuleMaxKeyBytes, wantMsg: "key is 3000 bytes; at most 2048 allowed (limit max-key-bytes)"},
		{name: "key too long for a custom limit", limits: Limits{MaxKeyBytes: 4}, cmd: putCmd("abcde", "v"), wantRule: RuleMaxKeyBytes, wantMsg: "key is 5 bytes; at most 4 allowed (limit max-key-bytes)"},
		{name: "value too large", cmd: putCmd("a", strings.Repeat("v", 512<<10+1)), wantRule: RuleMaxValueBytes, wantMsg: "value is 524289 bytes; at most 524288 allowed (limit max-value-bytes)"},
		{name: "delete empty key", cmd: delCmd(""), wantRule: RuleKeyNonEmpty, wantMsg: "key must not be empty"},
		{name: "delete empty prefix", cmd: delPrefix(""), wantRule: RuleKeyNonEmpty, wantMsg: "key must not be empty"},
		{name: "delete key too long", cmd: delPrefix(big), wantRule: RuleMaxKeyBytes, wantMsg: "key is 3000 bytes; at most 2048 allowed (limit max-key-bytes)"},
		{name: "cas with prefix delete", cmd: func() *lodestonepb.Command { c := delCAS("a", 3); c.GetDelete().Prefix = true; return c }(), wantRule: RuleNoCASWithPrefix, wantMsg: "cas is not allowed with prefix delete"},
		{name: "delete cas ok", cmd: delCAS("a", 3)},
		{name: "txn at limit", cmd: txnCmd(ops(64)...)},
		{name: "txn too many ops", cmd: txnCmd(ops(70)...), wantRule: RuleMaxTxnOps, wantMsg: "transaction has 70 operations; at most 64 allowed (limit max-txn-ops)"},
		{name: "txn empty", cmd: txnCmd(), wantRule: RuleTxnNonEmpty, wantMsg: "transaction has no operations; want at least 1"},
		{name: "txn nil request", cmd: &lodestonepb.Command{Op: &lodestonepb.Command_Txn{}}, wantRule: RuleTxnNonEmpty, wantMsg: "transaction has no operations; want at least 1"},
		{name: "txn unknown verb", cmd: txnCmd(opSet("a", ""), opSet("b", ""), opSet("c", ""), op(lodestonepb.TxnOp_Verb(99), "d")), wantRule: RuleKnownVerb, wantOp: 3,
			wantMsg: "txn op 3: unknown verb 99; want SET, GET, DELETE, DELETE_PREFIX, CAS, CHECK_INDEX, CHECK_NOT_EXISTS, DELETE_CAS, LOCK, UNLOCK or CHECK_SESSION"},
		{name: "txn unspecified verb", cmd: txnCmd(op(lodestonepb.TxnOp_VERB_UNSPECIFIED, "d")), wantRule: RuleKnownVerb,
			wantMsg: "txn op 0: unknown verb 0; want SET, GET, DELETE, DELETE_PREFIX, CAS, CHECK_INDEX, CHECK_NOT_EXISTS, DELETE_CAS, LOCK, UNLOCK or CHECK_SESSION"},
		{name: "txn nil op", cmd: txnCmd(opSet("a", ""), nil), wantRule: RuleCommandOp, wantOp: 1, wantMsg: "txn op 1: operation is empty"},
		{name: "txn empty key", cmd: txnCmd(op(GET, "")), wantRule: RuleKeyNonEmpty, wantMsg: "txn op 0: key must not be empty"},
		{name: "txn NUL key", cmd: txnCmd(opSet("ok", ""), op(GET, "\x00")), wantRule: RuleKeyNoNUL, wantOp: 1, wantMsg: "txn op 1: key must not contain a NUL byte (found at byte 0)"},
		{name: "txn key too long", cmd: txnCmd(op(DELETE_PREFIX, big)), wantRule: RuleMaxKeyBytes, wantMsg: "txn op 0: key is 3000 bytes; at most 2048 allowed (limit max-key-bytes)"},
		{name: "txn value too large", cmd: txnCmd(opCAS("a", strings.Repeat("v", 512<<10+1), 0)), wantRule: RuleMaxValueBytes, wantMsg: "txn op 0: value is 524289 bytes; at most 524288 allowed (limit max-value-bytes)"},
		{name: "txn set with index", cmd: txnCmd(opIdx(SET, "a", 5)), wantRule: RuleUnusedField, wantMsg: "txn op 0: index is not used by SET (use CAS for a conditional set)"},
		{name: "txn delete prefix with index", cmd: txnCmd(opIdx(DELETE_PREFIX, "a", 5)), wantRule: RuleUnusedField, wantMsg: "txn op 0: index is not used by DELETE_PREFIX (cas is not allowed with prefix delete)"},
		{name: "txn get with value", cmd: txnCmd(withValue(op(GET, "a"), "x")), wantRule: RuleUnusedField, wantMsg: "txn op 0: value is not used by GET; only SET, CAS, LOCK and UNLOCK write values"},
		{name: "txn delete with flags", cmd: txnCmd(withFlags(op(DELETE, "a"), 3)), wantRule: RuleUnusedField, wantMsg: "txn op 0: flags are not used by DELETE; only SET, CAS, LOCK and UNLOCK write flags"},
		{name: "txn check index 0", cmd: txnCmd(opIdx(CHECK_INDEX, "a", 0)), wantRule: RuleCheckIndexNonZero,
			wantMsg: "txn op 0: CHECK_INDEX needs index > 0 (a missing key never matches; use CHECK_NOT_EXISTS to require absence)"},
		{name: "txn every verb ok", cmd: txnCmd(opSet("a", "1"), op(GET, "a"), op(DELETE, "a"), op(DELETE_PREFIX, "a"), opCAS("a", "2", 0),
			opIdx(CHECK_INDEX, "a", 1), op(CHECK_NOT_EXISTS, "a"), opIdx(DELETE_CAS, "a", 0))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limits := l
			if tt.limits != (Limits{}) {
				limits = tt.limits
			}
			err := limits.ValidateCommand(tt.cmd)
			if tt.wantRule == "" {
				if err != nil {
					t.Fatalf("ValidateCommand = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("ValidateCommand = nil, want %s", tt.wantMsg)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			var ie *InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("error %T is not *InvalidError", err)
			}
			if got, want := ie.Rule, tt.wantRule; got != want {
				t.Errorf("rule = %q, want %q", got, want)
			}
			if got, want := err.Error(), tt.wantMsg; got != want {
				t.Errorf("message = %q\nwant      %q", got, want)
			}
			wantOp := -1
			if strings.HasPrefix(tt.wantMsg, "txn op ") {
				wantOp = tt.wantOp
			}
			if got, want := ie.Op, wantOp; got != want {
				t.Errorf("op = %d, want %d", got, want)
			}
		})
	}
}

// TestApplyRefusesMalformed checks that what CheckCommand refuses is also
// refused by Apply, with nothing changed but the index, and that what only
// the limits refuse is still applied (Apply must not depend on config).
func TestApplyRefusesMalformed(t *testing.T) {
	nilPut := &lodestonepb.Command{Op: &lodestonepb.Command_Put{}}
	casPrefix := delCAS("a", 1)
	casPrefix.GetDelete().Prefix = true
	tests := []struct {
		name      string
		cmd       *lodestonepb.Command
		wantNoRes bool // Result unset
		wantTxn   bool // TxnResponse with succeeded=false
	}{
		{"nil command", nil, true, false},
		{"no op", &lodestonepb.Command{}, true, false},
		{"nil put", nilPut, true, false},
		{"put empty key", putCmd("", "v"), true, false},
		{"put NUL key", putCmd("a\x00", "v"), true, false},
		{"delete empty key", delCmd(""), true, false},
		{"delete empty prefix", delPrefix(""), true, false},
		{"delete cas with prefix", casPrefix, true, false},
		{"txn unknown verb", txnCmd(opSet("x", "1"), op(lodestonepb.TxnOp_Verb(99), "a")), false, true},
		{"txn empty key", txnCmd(opSet("x", "1"), op(DELETE_PREFIX, "")), false, true},
		{"txn empty", txnCmd(), false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if CheckCommand(tt.cmd) == nil {
				t.Fatalf("CheckCommand accepts the command")
			}
			d := newDriver(t)
			d.applyAll(putCmd("a", "1"), putCmd("ab", "2"))
			before := dumpKVs(d.s)
			res, evs := d.apply(tt.cmd)
			if res == nil {
				t.Fatalf("Apply returned nil result for a new index")
			}
			if got, want := res.Result == nil, tt.wantNoRes; got != want {
				t.Errorf("Result unset = %v, want %v (%v)", got, want, res)
			}
			if tt.wantTxn && (res.GetTxn() == nil || res.GetTxn().Succeeded || len(res.GetTxn().Errors) == 0) {
				t.Errorf("txn result = %v, want failed with errors", res)
			}
			if len(evs) != 0 {
				t.Errorf("events %q from a refused command", fmtEvents(evs))
			}
			if got, want := dumpKVs(d.s), before; got != want {
				t.Errorf("state changed:\n%s\nwant\n%s", got, want)
			}
			if got, want := d.s.Index(), uint64(3); got != want {
				t.Errorf("Index = %d, want %d", got, want)
			}
		})
	}

	t.Run("limits are not applied by Apply", func(t *testing.T) {
		s := New()
		huge := strings.Repeat("k", 3000)
		if err := DefaultLimits().ValidateCommand(putCmd(huge, "v")); err == nil {
			t.Fatalf("ValidateCommand accepts a 3000-byte key")
		}
		res, _ := s.Apply(1, putCmd(huge, "v"))
		if res.GetPut().GetKv() == nil {
			t.Errorf("Apply refused a command only the limits refuse: %v", res)
		}
	})
}

func TestValidateKeyAndPrefix(t *testing.T) {
	l := Limits{MaxKeyBytes: 8}
	tests := []struct {
		name     string
		key      string
		wantKey  string // rule from ValidateKey, "" ok
		wantPref string // rule from ValidatePrefix, "" ok
	}{
		{"ordinary", "a/b", "", ""},
		{"empty", "", RuleKeyNonEmpty, ""},
		{"NUL", "a\x00", RuleKeyNoNUL, RuleKeyNoNUL},
		{"at limit", "12345678", "", ""},
		{"over limit", "123456789", RuleMaxKeyBytes, RuleMaxKeyBytes},
	}
	rule := func(err error) string {
		var ie *InvalidError
		if errors.As(err, &ie) {
			return ie.Rule
		}
		if err != nil {
			return "not an InvalidError: " + err.Error()
		}
		return ""
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, want := rule(l.ValidateKey([]byte(tt.key))), tt.wantKey; got != want {
				t.Errorf("ValidateKey rule = %q, want %q", got, want)
			}
			if got, want := rule(l.ValidatePrefix([]byte(tt.key))), tt.wantPref; got != want {
				t.Errorf("ValidatePrefix rule = %q, want %q", got, want)
			}
		})
	}
	if got, want := l.ValidatePrefix(make([]byte, 9)).Error(), "prefix is 9 bytes; at most 8 allowed (limit max-key-bytes)"; got != want {
		t.Errorf("prefix message = %q, want %q", got, want)
	}
}

func TestLimitsValidate(t *testing.T) {
	tests := []struct {
		name      string
		l         Limits
		wantField string
	}{
		{"defaults", DefaultLimits(), ""},
		{"zero means defaults", Limits{}, ""},
		{"negative key", Limits{MaxKeyBytes: -1}, "MaxKeyBytes"},
		{"key over ceiling", Limits{MaxKeyBytes: 64<<10 + 1}, "MaxKeyBytes"},
		{"value over ceiling", Limits{MaxValueBytes: 32<<20 + 1}, "MaxValueBytes"},
		{"txn ops over ceiling", Limits{MaxTxnOps: 5000}, "MaxTxnOps"},
		{"negative range", Limits{MaxRangeLimit: -5}, "MaxRangeLimit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.l.Validate()
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			var le *LimitsError
			if !errors.As(err, &le) || !errors.Is(err, ErrInvalidLimits) {
				t.Fatalf("Validate = %v, want *LimitsError wrapping ErrInvalidLimits", err)
			}
			if got, want := le.Field, tt.wantField; got != want {
				t.Errorf("field = %q, want %q", got, want)
			}
		})
	}
	if got, want := (Limits{MaxTxnOps: 5000}).Validate().Error(), "store: limits: MaxTxnOps is 5000; must be between 1 and 4096 (0 means the default)"; got != want {
		t.Errorf("message = %q, want %q", got, want)
	}
}

func TestRangeLimit(t *testing.T) {
	tests := []struct {
		name      string
		l         Limits
		requested uint32
		want      int
	}{
		{"unset means max", DefaultLimits(), 0, 10000},
		{"below max", DefaultLimits(), 50, 50},
		{"above max clamps", DefaultLimits(), 20000, 10000},
		{"zero limits use default", Limits{}, 0, 10000},
		{"custom", Limits{MaxRangeLimit: 10}, 11, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, want := tt.l.RangeLimit(tt.requested), tt.want; got != want {
				t.Errorf("RangeLimit(%d) = %d, want %d", tt.requested, got, want)
			}
		})
	}
}
