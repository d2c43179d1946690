package store

import (
	"errors"
	"fmt"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
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
	RuleKeyUTF8           = "key-utf8"            // a key written must be valid UTF-8 (Limits only, not Apply)
	RuleMaxKeyBytes       = "max-key-bytes"       // Limits.MaxKeyBytes
	RuleMaxValueBytes     = "max-value-bytes"     // Limits.MaxValueBytes
	RuleMaxTxnOps         = "max-txn-ops"         // Limits.MaxTxnOps
	RuleTxnNonEmpty       = "txn-non-empty"       // a transaction needs at least one op
	RuleNoCASWithPrefix   = "no-cas-with-prefix"  // delete: cas and prefix are exclusive
	RuleKnownVerb         = "known-verb"          // txn op verb must be one of TxnOp_Verb
	RuleUnusedField       = "unused-field"        // txn op sets a field its verb ignores
	RuleCheckIndexNonZero = "check-index-nonzero" // CHECK_INDEX needs index > 0

	RuleCommandTime      = "command-time"      // the command needs time_unix_nano (catalog, session, lock commands)
	RuleLockSession      = "lock-session"      // acquire, release, LOCK and UNLOCK need a session
	RuleLockExclusive    = "lock-exclusive"    // a put is acquire or release, not both
	RuleNameNonEmpty     = "name-non-empty"    // a required name or id is empty
	RuleNameNoNUL        = "name-no-nul"       // names and ids must not contain a 0x00 byte
	RuleMaxNameBytes     = "max-name-bytes"    // Limits.MaxNameBytes
	RuleUUID             = "uuid"              // session ids and node ids are UUIDs
	RuleNodeAddress      = "node-address"      // a node registration needs an address
	RuleCheckNode        = "check-node"        // a registration's checks belong to its node
	RuleHealthStatus     = "health-status"     // status must be a known HealthStatus
	RuleMeta             = "meta"              // node/service meta: Consul's pair, key and value limits
	RulePort             = "port"              // ports are 0..65535
	RuleWeights          = "weights"           // service weights: passing >= 1, warning >= 0
	RuleSessionTTL       = "session-ttl"       // SessionTTLMin..SessionTTLMax, or 0
	RuleLockDelay        = "lock-delay"        // at most MaxLockDelay
	RuleSessionBehavior  = "session-behavior"  // behavior must be release or delete
	RuleDuration         = "duration"          // durations must be valid and non-negative
	RuleInvalidateTarget = "invalidate-target" // session_invalidate needs ids or a node
)

// Rejection rules, carried in lodestonepb.Rejection.Rule and RejectedError.
// They name the state a well-formed command needed and did not find.
// Stable, like the Rule* names.
const (
	RejectNodeMissing    = "node-registered"    // the node is not in the catalog
	RejectServiceMissing = "service-registered" // a check names a service not on its node
	RejectCheckMissing   = "check-registered"   // a session or check update names a missing check
	RejectCheckCritical  = "check-not-critical" // a session cannot bind a critical check
	RejectSessionMissing = "session-exists"     // acquire or renew with an unknown session
	RejectSessionIDTaken = "session-id-unique"  // session create with an id already in use
	RejectNodeIDTaken    = "node-id-unique"     // a node id already belongs to another node
)

// ErrRejected is wrapped by the *RejectedError that ResultError returns
// for a command the state refused (CommandResult.rejected). Servers map it
// to gRPC FailedPrecondition (Consul answers HTTP 500 with the message).
var ErrRejected = errors.New("store: command rejected")

// RejectedError says which state a command needed and did not find. It
// wraps ErrRejected.
type RejectedError struct {
	Rule   string // one of the Reject* constants
	Detail string
}

// Error returns the detail, without a package prefix (servers show it as
// is).
func (e *RejectedError) Error() string { return e.Detail }

// Unwrap returns ErrRejected.
func (e *RejectedError) Unwrap() error { return ErrRejected }

// ResultError returns a *RejectedError for a result whose command was
// rejected by the state, else nil. It does not report cas_failed or
// lock_failed (those are answers, not errors) nor a malformed command
// (Result unset: use CheckCommand).
func ResultError(res *lodestonepb.CommandResult) error {
	if r := res.GetRejected(); r != nil {
		return &RejectedError{Rule: r.Rule, Detail: r.Detail}
	}
	return nil
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

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
