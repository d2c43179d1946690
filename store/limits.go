package store

import (
	"bytes"
	"fmt"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Limits bounds what a client may propose. They are enforced BEFORE a
// command is proposed (ValidateCommand) and never by Apply: replicas may run
// with different limits, and Apply must produce the same state on all of
// them. Lowering a limit therefore never breaks replay of older entries.
//
// The zero value of every field means "use the default", so Limits{} is
// usable and equal in effect to DefaultLimits().
type Limits struct {
	// MaxKeyBytes is the largest key (and Get/Range/Delete prefix), in
	// bytes. Default 2048. Zero means the default. At most 65536. Raising it
	// grows every B-tree comparison and every watch match.
	MaxKeyBytes int
	// MaxValueBytes is the largest value of one Put or txn SET/CAS, in
	// bytes. Default 524288 (512 KiB, Consul's limit). Zero means the
	// default. At most 33554432 (32 MiB). A transaction may carry
	// MaxTxnOps values of this size, so the product bounds one Raft entry;
	// raising it makes replication and snapshots of large values slower.
	MaxValueBytes int
	// MaxTxnOps is the most operations in one transaction. Default 64
	// (Consul's limit). Zero means the default. At most 4096. A transaction
	// holds the store's write lock for its whole run, so this bounds how
	// long one command can stall readers.
	MaxTxnOps int
	// MaxRangeLimit is the most keys one Range answer returns; clients page
	// with start_after beyond it. Default 10000. Zero means the default. At
	// most 1000000. A Range holds the store's read lock while it collects
	// keys, so this bounds how long one read can delay Apply.
	MaxRangeLimit int
}

// Defaults and hard ceilings of Limits.
const (
	DefaultMaxKeyBytes   = 2048
	DefaultMaxValueBytes = 512 << 10
	DefaultMaxTxnOps     = 64
	DefaultMaxRangeLimit = 10000

	ceilMaxKeyBytes   = 64 << 10
	ceilMaxValueBytes = 32 << 20
	ceilMaxTxnOps     = 4096
	ceilMaxRangeLimit = 1000000
)

// DefaultLimits returns the limits a server uses unless configured.
func DefaultLimits() Limits {
	return Limits{
		MaxKeyBytes:   DefaultMaxKeyBytes,   // 2 KiB
		MaxValueBytes: DefaultMaxValueBytes, // 512 KiB, as Consul
		MaxTxnOps:     DefaultMaxTxnOps,     // 64, as Consul
		MaxRangeLimit: DefaultMaxRangeLimit, // 10000 keys per Range answer
	}
}

// withDefaults replaces zero fields by their defaults.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxKeyBytes == 0 {
		l.MaxKeyBytes = d.MaxKeyBytes
	}
	if l.MaxValueBytes == 0 {
		l.MaxValueBytes = d.MaxValueBytes
	}
	if l.MaxTxnOps == 0 {
		l.MaxTxnOps = d.MaxTxnOps
	}
	if l.MaxRangeLimit == 0 {
		l.MaxRangeLimit = d.MaxRangeLimit
	}
	return l
}

// Validate reports the first field out of range as a *LimitsError wrapping
// ErrInvalidLimits. Zero fields are valid (they mean the default).
func (l Limits) Validate() error {
	for _, f := range []struct {
		name    string
		v, ceil int
	}{
		{"MaxKeyBytes", l.MaxKeyBytes, ceilMaxKeyBytes},
		{"MaxValueBytes", l.MaxValueBytes, ceilMaxValueBytes},
		{"MaxTxnOps", l.MaxTxnOps, ceilMaxTxnOps},
		{"MaxRangeLimit", l.MaxRangeLimit, ceilMaxRangeLimit},
	} {
		if f.v < 0 || f.v > f.ceil {
			return &LimitsError{Field: f.name, Value: f.v,
				Reason: fmt.Sprintf("must be between 1 and %d (0 means the default)", f.ceil)}
		}
	}
	return nil
}

// RangeLimit turns a client's requested page size into the limit to pass to
// Store.Range: 0 (unset) and anything above MaxRangeLimit become
// MaxRangeLimit.
func (l Limits) RangeLimit(requested uint32) int {
	max := l.withDefaults().MaxRangeLimit
	if requested == 0 || uint64(requested) > uint64(max) {
		return max
	}
	return int(requested)
}

// ValidateKey checks a key for Get, Put, Delete and txn ops: not empty, no
// NUL byte, at most MaxKeyBytes. The error is an *InvalidError wrapping
// ErrInvalid.
func (l Limits) ValidateKey(key []byte) error {
	if len(key) == 0 {
		return invalid(-1, "key", RuleKeyNonEmpty, "key must not be empty")
	}
	return l.validatePrefix(-1, "key", key)
}

// ValidatePrefix checks a Range prefix or start_after key: like ValidateKey,
// but empty is allowed (it selects every key).
func (l Limits) ValidatePrefix(prefix []byte) error {
	return l.validatePrefix(-1, "prefix", prefix)
}

func (l Limits) validatePrefix(op int, field string, key []byte) error {
	l = l.withDefaults()
	if len(key) > l.MaxKeyBytes {
		return invalid(op, field, RuleMaxKeyBytes,
			"%s is %d bytes; at most %d allowed (limit max-key-bytes)", field, len(key), l.MaxKeyBytes)
	}
	if i := bytes.IndexByte(key, 0); i >= 0 {
		return invalid(op, field, RuleKeyNoNUL,
			"%s must not contain a NUL byte (found at byte %d)", field, i)
	}
	return nil
}

func (l Limits) validateValue(op int, value []byte) error {
	if max := l.withDefaults().MaxValueBytes; len(value) > max {
		return invalid(op, "value", RuleMaxValueBytes,
			"value is %d bytes; at most %d allowed (limit max-value-bytes)", len(value), max)
	}
	return nil
}

// ValidateCommand checks a command BEFORE it is proposed: the structural
// rules of CheckCommand plus the size limits, plus rules that catch client
// mistakes (a txn op field its verb ignores, CHECK_INDEX with index 0). It
// returns the first problem as an *InvalidError wrapping ErrInvalid, or nil.
// It does not read the store: conditions (cas, checks) are decided by
// Apply.
func (l Limits) ValidateCommand(cmd *lodestonepb.Command) error {
	if err := CheckCommand(cmd); err != nil {
		return err
	}
	l = l.withDefaults()
	switch op := cmd.Op.(type) {
	case *lodestonepb.Command_Put:
		if err := l.ValidateKey(op.Put.Key); err != nil {
			return err
		}
		return l.validateValue(-1, op.Put.Value)
	case *lodestonepb.Command_Delete:
		return l.ValidateKey(op.Delete.Key)
	case *lodestonepb.Command_Txn:
		ops := op.Txn.Ops
		if len(ops) > l.MaxTxnOps {
			return invalid(-1, "ops", RuleMaxTxnOps,
				"transaction has %d operations; at most %d allowed (limit max-txn-ops)", len(ops), l.MaxTxnOps)
		}
		for i, o := range ops {
			if err := l.validateTxnOp(i, o); err != nil {
				return err
			}
		}
	}
	return nil
}

// verbUses says which optional fields a verb reads.
func verbUses(v lodestonepb.TxnOp_Verb) (value, index bool) {
	switch v {
	case lodestonepb.TxnOp_SET:
		return true, false
	case lodestonepb.TxnOp_CAS:
		return true, true
	case lodestonepb.TxnOp_CHECK_INDEX, lodestonepb.TxnOp_DELETE_CAS:
		return false, true
	}
	return false, false
}

func (l Limits) validateTxnOp(i int, o *lodestonepb.TxnOp) error {
	if err := l.validatePrefix(i, "key", o.Key); err != nil {
		return err
	}
	usesValue, usesIndex := verbUses(o.Verb)
	if usesValue {
		if err := l.validateValue(i, o.Value); err != nil {
			return err
		}
	} else {
		if len(o.Value) > 0 {
			return invalid(i, "value", RuleUnusedField, "value is not used by %s; only SET and CAS write values", o.Verb)
		}
		if o.Flags != 0 {
			return invalid(i, "flags", RuleUnusedField, "flags are not used by %s; only SET and CAS write flags", o.Verb)
		}
	}
	if !usesIndex && o.Index != 0 {
		hint := ""
		switch o.Verb {
		case lodestonepb.TxnOp_SET:
			hint = " (use CAS for a conditional set)"
		case lodestonepb.TxnOp_DELETE:
			hint = " (use DELETE_CAS for a conditional delete)"
		case lodestonepb.TxnOp_DELETE_PREFIX:
			hint = " (cas is not allowed with prefix delete)"
		}
		return invalid(i, "index", RuleUnusedField, "index is not used by %s%s", o.Verb, hint)
	}
	if o.Verb == lodestonepb.TxnOp_CHECK_INDEX && o.Index == 0 {
		return invalid(i, "index", RuleCheckIndexNonZero,
			"CHECK_INDEX needs index > 0 (a missing key never matches; use CHECK_NOT_EXISTS to require absence)")
	}
	return nil
}

// CheckCommand applies the structural rules that do not depend on
// configuration, and that Apply itself enforces (so every replica agrees):
// the command carries exactly one operation, keys are not empty and hold no
// NUL byte, a delete is not both prefix and cas, a transaction has at least
// one op and every op has a known verb. It returns the first problem as an
// *InvalidError wrapping ErrInvalid, or nil.
//
// When Apply meets a command CheckCommand refuses, it changes nothing but
// the applied index; the server can call CheckCommand to tell the proposer
// why (see Apply).
func CheckCommand(cmd *lodestonepb.Command) error {
	if cmd == nil {
		return invalid(-1, "command", RuleCommandOp, "command has no operation; want put, delete or txn")
	}
	switch op := cmd.Op.(type) {
	case *lodestonepb.Command_Put:
		if op.Put == nil {
			return invalid(-1, "command", RuleCommandOp, "put command has no request")
		}
		return checkKey(-1, op.Put.Key)
	case *lodestonepb.Command_Delete:
		d := op.Delete
		if d == nil {
			return invalid(-1, "command", RuleCommandOp, "delete command has no request")
		}
		if err := checkKey(-1, d.Key); err != nil {
			return err
		}
		if d.Prefix && d.Cas != nil {
			return invalid(-1, "cas", RuleNoCASWithPrefix, "cas is not allowed with prefix delete")
		}
		return nil
	case *lodestonepb.Command_Txn:
		if op.Txn == nil || len(op.Txn.Ops) == 0 {
			return invalid(-1, "ops", RuleTxnNonEmpty, "transaction has no operations; want at least 1")
		}
		for i, o := range op.Txn.Ops {
			if err := checkTxnOp(i, o); err != nil {
				return err
			}
		}
		return nil
	default:
		return invalid(-1, "command", RuleCommandOp, "command has no operation; want put, delete or txn")
	}
}

func checkKey(op int, key []byte) error {
	if len(key) == 0 {
		return invalid(op, "key", RuleKeyNonEmpty, "key must not be empty")
	}
	if i := bytes.IndexByte(key, 0); i >= 0 {
		return invalid(op, "key", RuleKeyNoNUL, "key must not contain a NUL byte (found at byte %d)", i)
	}
	return nil
}

func checkTxnOp(i int, o *lodestonepb.TxnOp) error {
	if o == nil {
		return invalid(i, "command", RuleCommandOp, "operation is empty")
	}
	if _, ok := lodestonepb.TxnOp_Verb_name[int32(o.Verb)]; !ok || o.Verb == lodestonepb.TxnOp_VERB_UNSPECIFIED {
		return invalid(i, "verb", RuleKnownVerb,
			"unknown verb %d; want SET, GET, DELETE, DELETE_PREFIX, CAS, CHECK_INDEX, CHECK_NOT_EXISTS or DELETE_CAS", int32(o.Verb))
	}
	return checkKey(i, o.Key)
}
