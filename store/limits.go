package store

import (
	"bytes"
	"fmt"
	"unicode/utf8"

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
	// long one command can stall readers. It bounds the keys of one
	// GetMany too, which holds the read lock as long.
	MaxTxnOps int
	// MaxRangeLimit is the most keys one Range answer returns; clients page
	// with start_after beyond it. Default 10000. Zero means the default. At
	// most 1000000. A Range holds the store's read lock while it collects
	// keys, so this bounds how long one read can delay Apply.
	MaxRangeLimit int
	// MaxNameBytes is the longest catalog or session name or id (node
	// name, service name and id, check id and name, session id, node and
	// name, tag), in bytes. Default 512. Zero means the default. At most
	// 65536. Names are B-tree keys and part of event keys, so raising it
	// grows comparisons and watch matching like MaxKeyBytes.
	MaxNameBytes int
}

// Defaults and hard ceilings of Limits.
const (
	DefaultMaxKeyBytes   = 2048
	DefaultMaxValueBytes = 512 << 10
	DefaultMaxTxnOps     = 64
	DefaultMaxRangeLimit = 10000
	DefaultMaxNameBytes  = 512

	ceilMaxKeyBytes   = 64 << 10
	ceilMaxValueBytes = 32 << 20
	ceilMaxTxnOps     = 4096
	ceilMaxRangeLimit = 1000000
	ceilMaxNameBytes  = 64 << 10
)

// DefaultLimits returns the limits a server uses unless configured.
func DefaultLimits() Limits {
	return Limits{
		MaxKeyBytes:   DefaultMaxKeyBytes,   // 2 KiB
		MaxValueBytes: DefaultMaxValueBytes, // 512 KiB, as Consul
		MaxTxnOps:     DefaultMaxTxnOps,     // 64, as Consul
		MaxRangeLimit: DefaultMaxRangeLimit, // 10000 keys per Range answer
		MaxNameBytes:  DefaultMaxNameBytes,  // 512 bytes per catalog name or id
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
	if l.MaxNameBytes == 0 {
		l.MaxNameBytes = d.MaxNameBytes
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
		{"MaxNameBytes", l.MaxNameBytes, ceilMaxNameBytes},
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

// TxnOpsLimit is MaxTxnOps, or its default when zero: the most operations
// of one transaction and the most keys of one GetMany.
func (l Limits) TxnOpsLimit() int { return l.withDefaults().MaxTxnOps }

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

// validateKeyUTF8 is the rule for a key a write stores (a put, a txn SET,
// CAS, LOCK or UNLOCK): it must be valid UTF-8. The Consul API lists keys
// as JSON strings, the CLI prints them and gRPC clients in most languages
// turn them into strings; each of these replaces bytes that are not UTF-8
// with U+FFFD, so such a key would be listed in a form that cannot address
// it. Reads and deletes take any bytes, so that keys stored by older
// versions, which did not check, can still be read and removed over gRPC.
// Not part of CheckCommand: Apply must replay those older entries.
func validateKeyUTF8(op int, key []byte) error {
	if utf8.Valid(key) {
		return nil
	}
	at := 0
	for at < len(key) {
		r, n := utf8.DecodeRune(key[at:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		at += n
	}
	return invalid(op, "key", RuleKeyUTF8,
		"key must be valid UTF-8 (invalid byte 0x%02x at byte %d); keys are listed as text, so a key that is not could not be addressed back", key[at], at)
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
// mistakes (a txn op field its verb ignores, CHECK_INDEX with index 0, a
// session TTL out of range, ...). It returns the first problem as an
// *InvalidError wrapping ErrInvalid, or nil. It does not read the store:
// conditions (cas, locks, registrations) are decided by Apply.
//
// The server stamps time_unix_nano BEFORE calling it: catalog and session
// commands, a put with acquire and a txn with LOCK need it.
func (l Limits) ValidateCommand(cmd *lodestonepb.Command) error {
	if err := CheckCommand(cmd); err != nil {
		return err
	}
	l = l.withDefaults()
	if needsTime(cmd) && cmd.TimeUnixNano <= 0 {
		return invalid(-1, "time_unix_nano", RuleCommandTime,
			"command has no time_unix_nano; the proposing server must stamp catalog, session and lock commands with its clock")
	}
	switch op := cmd.Op.(type) {
	case *lodestonepb.Command_Put:
		p := op.Put
		if err := l.ValidateKey(p.Key); err != nil {
			return err
		}
		if err := validateKeyUTF8(-1, p.Key); err != nil {
			return err
		}
		if p.Session != "" && !p.Acquire && !p.Release {
			return invalid(-1, "session", RuleUnusedField, "session is only used with acquire or release")
		}
		return l.validateValue(-1, p.Value)
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
	case *lodestonepb.Command_CatalogRegister:
		return l.validateRegister(op.CatalogRegister)
	case *lodestonepb.Command_CatalogTxn:
		return l.validateCatalogTxn(op.CatalogTxn)
	case *lodestonepb.Command_CatalogDeregister:
		d := op.CatalogDeregister
		return l.names(name{"node", d.Node}, name{"service_id", d.ServiceId}, name{"check_id", d.CheckId})
	case *lodestonepb.Command_CheckUpdate:
		u := op.CheckUpdate
		if err := l.names(name{"node", u.Node}, name{"check_id", u.CheckId}); err != nil {
			return err
		}
		return l.validateOutput(u.Output)
	case *lodestonepb.Command_SessionCreate:
		return l.validateSession(op.SessionCreate.Session)
	case *lodestonepb.Command_SessionDestroy:
		return validateUUID("id", op.SessionDestroy.Id)
	case *lodestonepb.Command_SessionRenew:
		return validateUUID("id", op.SessionRenew.Id)
	case *lodestonepb.Command_SessionInvalidate:
		v := op.SessionInvalidate
		for _, id := range v.Ids {
			if err := validateUUID("ids", id); err != nil {
				return err
			}
		}
		return l.names(name{"node", v.Node})
	}
	return nil
}

// needsTime reports whether Apply reads cmd's time_unix_nano.
func needsTime(cmd *lodestonepb.Command) bool {
	switch op := cmd.Op.(type) {
	case *lodestonepb.Command_Put:
		return op.Put.Acquire
	case *lodestonepb.Command_Txn:
		for _, o := range op.Txn.Ops {
			if o.Verb == lodestonepb.TxnOp_LOCK {
				return true
			}
		}
		return false
	case *lodestonepb.Command_CatalogRegister, *lodestonepb.Command_CatalogDeregister, *lodestonepb.Command_CheckUpdate, *lodestonepb.Command_CatalogTxn,
		*lodestonepb.Command_Restore,
		*lodestonepb.Command_SessionCreate, *lodestonepb.Command_SessionDestroy, *lodestonepb.Command_SessionRenew,
		*lodestonepb.Command_SessionInvalidate:
		return true
	}
	return false
}

// verbUses says which optional fields a verb reads.
func verbUses(v lodestonepb.TxnOp_Verb) (value, index, session bool) {
	switch v {
	case lodestonepb.TxnOp_SET:
		return true, false, false
	case lodestonepb.TxnOp_CAS:
		return true, true, false
	case lodestonepb.TxnOp_CHECK_INDEX, lodestonepb.TxnOp_DELETE_CAS:
		return false, true, false
	case lodestonepb.TxnOp_LOCK, lodestonepb.TxnOp_UNLOCK:
		return true, false, true
	case lodestonepb.TxnOp_CHECK_SESSION:
		return false, false, true
	}
	return false, false, false
}

func (l Limits) validateTxnOp(i int, o *lodestonepb.TxnOp) error {
	if err := l.validatePrefix(i, "key", o.Key); err != nil {
		return err
	}
	usesValue, usesIndex, usesSession := verbUses(o.Verb)
	if usesValue {
		// NB: the verbs that store a key are those that write a value.
		if err := validateKeyUTF8(i, o.Key); err != nil {
			return err
		}
		if err := l.validateValue(i, o.Value); err != nil {
			return err
		}
	} else {
		if len(o.Value) > 0 {
			return invalid(i, "value", RuleUnusedField, "value is not used by %s; only SET, CAS, LOCK and UNLOCK write values", o.Verb)
		}
		if o.Flags != 0 {
			return invalid(i, "flags", RuleUnusedField, "flags are not used by %s; only SET, CAS, LOCK and UNLOCK write flags", o.Verb)
		}
	}
	if !usesSession && o.Session != "" {
		return invalid(i, "session", RuleUnusedField, "session is not used by %s; only LOCK, UNLOCK and CHECK_SESSION use it", o.Verb)
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
// one op and every op has a known verb, a lock operation names a session
// and is either acquire or release; catalog and session commands carry
// their request, their required names and ids are not empty, no name or id
// holds a NUL byte (they are part of event keys), enums are known, and a
// registration's checks belong to its node; member and admission commands
// carry their message (their content is the proposing server's to check).
// It returns the first problem as an *InvalidError wrapping ErrInvalid, or
// nil.
//
// When Apply meets a command CheckCommand refuses, it changes nothing but
// the applied index; the server can call CheckCommand to tell the proposer
// why (see Apply).
func CheckCommand(cmd *lodestonepb.Command) error {
	if cmd == nil {
		return invalid(-1, "command", RuleCommandOp, noOpMessage)
	}
	switch op := cmd.Op.(type) {
	case *lodestonepb.Command_Put:
		if op.Put == nil {
			return invalid(-1, "command", RuleCommandOp, "put command has no request")
		}
		return checkPut(op.Put)
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
	case *lodestonepb.Command_CatalogRegister:
		return checkRegister(op.CatalogRegister)
	case *lodestonepb.Command_CatalogDeregister:
		return checkDeregister(op.CatalogDeregister)
	case *lodestonepb.Command_CatalogTxn:
		return checkCatalogTxn(op.CatalogTxn)
	case *lodestonepb.Command_CheckUpdate:
		return checkCheckUpdate(op.CheckUpdate)
	case *lodestonepb.Command_SessionCreate:
		return checkSessionCreate(op.SessionCreate)
	case *lodestonepb.Command_SessionDestroy:
		if op.SessionDestroy == nil {
			return invalid(-1, "command", RuleCommandOp, "session_destroy command has no request")
		}
		return checkSessionID(op.SessionDestroy.Id)
	case *lodestonepb.Command_SessionRenew:
		if op.SessionRenew == nil {
			return invalid(-1, "command", RuleCommandOp, "session_renew command has no request")
		}
		return checkSessionID(op.SessionRenew.Id)
	case *lodestonepb.Command_SessionInvalidate:
		return checkSessionInvalidate(op.SessionInvalidate)
	case *lodestonepb.Command_Member:
		if op.Member == nil {
			return invalid(-1, "command", RuleCommandOp, "member command has no member")
		}
		return nil
	case *lodestonepb.Command_Admission:
		if op.Admission == nil {
			return invalid(-1, "command", RuleCommandOp, "admission command has no policy")
		}
		return nil
	case *lodestonepb.Command_Acl:
		return checkACL(op.Acl)
	case *lodestonepb.Command_Restore:
		if op.Restore == nil || len(op.Restore.State) == 0 {
			return invalid(-1, "command", RuleCommandOp, "restore command carries no state")
		}
		return nil
	default:
		return invalid(-1, "command", RuleCommandOp, noOpMessage)
	}
}

const noOpMessage = "command has no operation; want put, delete, txn, or a catalog or session command"

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
			"unknown verb %d; want SET, GET, DELETE, DELETE_PREFIX, CAS, CHECK_INDEX, CHECK_NOT_EXISTS, DELETE_CAS, LOCK, UNLOCK or CHECK_SESSION", int32(o.Verb))
	}
	if (o.Verb == lodestonepb.TxnOp_LOCK || o.Verb == lodestonepb.TxnOp_UNLOCK) && o.Session == "" {
		return invalid(i, "session", RuleLockSession, "%s needs a session", o.Verb)
	}
	return checkKey(i, o.Key)
}
