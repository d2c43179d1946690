package client

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors. A failed call returns an *Error that matches, with
// errors.Is, the sentinel for its gRPC code (and ErrUnknownOutcome when a
// write may have been applied).
var (
	// ErrCASFailed means a condition of the request did not hold
	// (FailedPrecondition), and the write was not applied. For KV writes:
	// the key's ModifyIndex was not the CAS index given, or the key existed
	// when it had to be absent. For membership changes: the member's state
	// did not allow it (e.g. promoting a voter); the message says which.
	ErrCASFailed = errors.New("client: compare-and-swap failed")

	// ErrUnavailable means no server could serve the request: the server
	// answered Unavailable (no leader, shutting down; the request was not
	// applied), or no endpoint could be reached.
	ErrUnavailable = errors.New("client: unavailable")

	// ErrInvalidArgument means the server rejected the request
	// (InvalidArgument); the message names the violated limit.
	ErrInvalidArgument = errors.New("client: invalid argument")

	// ErrNotFound means the server does not know the named object
	// (NotFound), e.g. an unknown member. A missing key is not an error:
	// Get answers with an unset Kv.
	ErrNotFound = errors.New("client: not found")

	// ErrUnknownOutcome means a write failed after it was sent: the server
	// may or may not have applied it. The client never retries such a write.
	ErrUnknownOutcome = errors.New("client: write outcome unknown")

	// ErrPermissionDenied means the call's ACL token may not make it (or
	// no one issued the token); nothing was changed. It is never retried.
	ErrPermissionDenied = errors.New("client: permission denied")

	// ErrClosed means the Client was closed before or during the call.
	ErrClosed = errors.New("client: closed")
)

// Error is the error of a failed call. Match it with errors.Is against the
// sentinels above, or errors.As to read its fields.
type Error struct {
	// Op names the call and its subject, e.g. `put "greeting"`.
	Op string
	// Endpoint is the address of the last endpoint tried ("" if none was).
	Endpoint string
	// Code is the gRPC code of the last failure (DeadlineExceeded or
	// Canceled when the call's ctx ended it).
	Code codes.Code
	// Message is the server's message, or the transport's or context's
	// description when no server answered.
	Message string
	// FromServer is true when Code and Message came from a server's answer,
	// false when the transport or the ctx produced them.
	FromServer bool
	// Attempts counts the attempts made.
	Attempts int
	// UnknownOutcome is true for a write that failed after it was sent.
	UnknownOutcome bool

	cause error // status error or ctx error; returned by Unwrap
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("client: ")
	b.WriteString(e.Op)
	if e.Endpoint != "" {
		b.WriteString(" via ")
		b.WriteString(e.Endpoint)
	}
	b.WriteString(": ")
	b.WriteString(codeText(e.Code))
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if e.Attempts > 1 {
		fmt.Fprintf(&b, " (after %d attempts)", e.Attempts)
	}
	if e.UnknownOutcome {
		b.WriteString(" (the write may or may not have been applied)")
	}
	return b.String()
}

// Is reports whether target is the sentinel for e's code, or
// ErrUnknownOutcome for a write whose outcome is unknown.
func (e *Error) Is(target error) bool {
	if target == ErrUnknownOutcome {
		return e.UnknownOutcome
	}
	return target != nil && target == sentinelFor(e.Code)
}

// Unwrap returns the underlying gRPC status error or context error.
func (e *Error) Unwrap() error { return e.cause }

// GRPCStatus lets status.FromError and status.Code read e's code.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// sentinelFor maps a gRPC code to its sentinel, nil for unmapped codes.
func sentinelFor(c codes.Code) error {
	switch c {
	case codes.FailedPrecondition:
		return ErrCASFailed
	case codes.Unavailable:
		return ErrUnavailable
	case codes.InvalidArgument:
		return ErrInvalidArgument
	case codes.NotFound:
		return ErrNotFound
	case codes.PermissionDenied:
		return ErrPermissionDenied
	case codes.DeadlineExceeded:
		return context.DeadlineExceeded
	case codes.Canceled:
		return context.Canceled
	}
	return nil
}

func codeText(c codes.Code) string {
	switch c {
	case codes.FailedPrecondition:
		return "failed precondition"
	case codes.Unavailable:
		return "unavailable"
	case codes.InvalidArgument:
		return "invalid argument"
	case codes.NotFound:
		return "not found"
	case codes.PermissionDenied:
		return "acl" // the message says what was denied
	case codes.DeadlineExceeded:
		return "deadline exceeded"
	case codes.Canceled:
		return "canceled"
	}
	return strings.ToLower(c.String())
}
