package store

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every error that refuses a command or a key
// before it is proposed (Limits.ValidateCommand, Limits.ValidateKey,
// CheckCommand). The concrete error is an *InvalidError naming the rule.
// Servers map it to gRPC InvalidArgument / HTTP 400.
var ErrInvalid = errors.New("store: invalid command")

// ErrInvalidLimits is wrapped by the *LimitsError that Limits.Validate
// returns for a bad configuration.
var ErrInvalidLimits = errors.New("store: invalid limits")

// ErrCorruptSnapshot is wrapped by every error Restore returns for input
// that is not a complete, intact snapshot this build can read (bad magic,
// unsupported version, checksum mismatch, truncation, out-of-order or
// undecodable records, trailer disagreement). The concrete error is a
// *CorruptSnapshotError. When Restore returns it the store is unchanged.
var ErrCorruptSnapshot = errors.New("store: corrupt snapshot")

// Rule names, carried in InvalidError.Rule. They are stable: clients and
// tests may switch on them (never on the message text).
const (
	RuleCommandOp         = "command-op"          // the command or txn op carries no operation
	RuleKeyNonEmpty       = "key-non-empty"       // keys (and delete prefixes) must not be empty
	RuleKeyNoNUL          = "key-no-nul"          // keys must not contain a 0x00 byte
	RuleMaxKeyBytes       = "max-key-bytes"       // Limits.MaxKeyBytes
	RuleMaxValueBytes     = "max-value-bytes"     // Limits.MaxValueBytes
	RuleMaxTxnOps         = "max-txn-ops"         // Limits.MaxTxnOps
	RuleTxnNonEmpty       = "txn-non-empty"       // a transaction needs at least one op
	RuleNoCASWithPrefix   = "no-cas-with-prefix"  // delete: cas and prefix are exclusive
	RuleKnownVerb         = "known-verb"          // txn op verb must be one of TxnOp_Verb
	RuleUnusedField       = "unused-field"        // txn op sets a field its verb ignores
	RuleCheckIndexNonZero = "check-index-nonzero" // CHECK_INDEX needs index > 0
)

// InvalidError says why a command (or key) is refused and what is allowed.
// It wraps ErrInvalid.
type InvalidError struct {
	// Op is the position of the offending operation inside a transaction,
	// or -1 when the error is not about a transaction operation.
	Op int
	// Field names the offending part: "command", "key", "value", "ops",
	// "cas", "verb", "index", "flags".
	Field string
	// Rule is one of the Rule* constants.
	Rule string
	// Detail is the human sentence: what was found and what is allowed.
	Detail string
}

// Error returns the detail, prefixed with "txn op N: " for a transaction
// operation. It carries no package prefix because servers show it to users
// as is.
func (e *InvalidError) Error() string {
	if e.Op >= 0 {
		return fmt.Sprintf("txn op %d: %s", e.Op, e.Detail)
	}
	return e.Detail
}

// Unwrap returns ErrInvalid.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

func invalid(op int, field, rule, format string, args ...any) *InvalidError {
	return &InvalidError{Op: op, Field: field, Rule: rule, Detail: fmt.Sprintf(format, args...)}
}

// LimitsError names the Limits field that Validate refused. It wraps
// ErrInvalidLimits.
type LimitsError struct {
	Field  string // Go field name, e.g. "MaxKeyBytes"
	Value  int
	Reason string // e.g. "must be between 1 and 65536"
}

func (e *LimitsError) Error() string {
	return fmt.Sprintf("store: limits: %s is %d; %s", e.Field, e.Value, e.Reason)
}

// Unwrap returns ErrInvalidLimits.
func (e *LimitsError) Unwrap() error { return ErrInvalidLimits }

// CorruptSnapshotError says what is wrong with a snapshot stream and where.
// It wraps ErrCorruptSnapshot.
type CorruptSnapshotError struct {
	// Records is how many records (members + keys) were read intact before
	// the problem was found.
	Records int
	// Offset is the byte offset in the stream where the bad part starts.
	Offset int64
	// Reason is a short description, e.g. "record 12 checksum mismatch".
	Reason string
	// Err is an underlying error (an I/O or protobuf error), may be nil.
	Err error
}

func (e *CorruptSnapshotError) Error() string {
	msg := fmt.Sprintf("store: corrupt snapshot: %s (offset %d)", e.Reason, e.Offset)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns ErrCorruptSnapshot and the underlying error, if any, so
// errors.Is matches both.
func (e *CorruptSnapshotError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrCorruptSnapshot, e.Err}
	}
	return []error{ErrCorruptSnapshot}
}
