package client

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestJudge pins the retry policy of the package doc, case by case.
func TestJudge(t *testing.T) {
	st := func(c codes.Code) error { return status.Error(c, "x") }
	for _, tc := range []struct {
		name  string
		write bool
		a     attempt
		want  verdict
	}{
		{"read: server unavailable", false, attempt{err: st(codes.Unavailable), sent: true, responded: true}, verdict{retry: true}},
		{"write: server unavailable proves not applied", true, attempt{err: st(codes.Unavailable), sent: true, responded: true}, verdict{retry: true}},
		{"read: connection never established", false, attempt{err: st(codes.Unavailable)}, verdict{retry: true}},
		{"write: connection never established", true, attempt{err: st(codes.Unavailable)}, verdict{retry: true}},
		{"read: stream reset after send", false, attempt{err: st(codes.Unavailable), sent: true}, verdict{retry: true}},
		{"write: stream reset after send", true, attempt{err: st(codes.Unavailable), sent: true}, verdict{unknown: true}},
		{"write: RST_STREAM internal after send", true, attempt{err: st(codes.Internal), sent: true}, verdict{unknown: true}},
		{"write: ctx deadline after send", true, attempt{err: st(codes.DeadlineExceeded), sent: true, ctxDone: true}, verdict{unknown: true}},
		{"write: ctx deadline before send", true, attempt{err: st(codes.DeadlineExceeded), ctxDone: true}, verdict{}},
		{"read: ctx deadline", false, attempt{err: st(codes.DeadlineExceeded), sent: true, ctxDone: true}, verdict{}},
		{"read: server deadline exceeded", false, attempt{err: st(codes.DeadlineExceeded), sent: true, responded: true}, verdict{retry: true}},
		{"write: server deadline exceeded", true, attempt{err: st(codes.DeadlineExceeded), sent: true, responded: true}, verdict{unknown: true}},
		{"write: cas failed", true, attempt{err: st(codes.FailedPrecondition), sent: true, responded: true}, verdict{}},
		{"write: invalid argument", true, attempt{err: st(codes.InvalidArgument), sent: true, responded: true}, verdict{}},
		{"write: server internal", true, attempt{err: st(codes.Internal), sent: true, responded: true}, verdict{unknown: true}},
		{"read: server internal", false, attempt{err: st(codes.Internal), sent: true, responded: true}, verdict{}},
		{"read: not found", false, attempt{err: st(codes.NotFound), sent: true, responded: true}, verdict{}},
		{"read: client-side marshal error", false, attempt{err: st(codes.ResourceExhausted)}, verdict{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := judge(tc.write, tc.a), tc.want; got != want {
				t.Errorf("judge(write=%v, %+v) = %+v, want %+v", tc.write, tc.a, got, want)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	base, max := 50*time.Millisecond, time.Second
	lo := func(n int64) int64 { return 0 }
	hi := func(n int64) int64 { return n - 1 }
	for _, tc := range []struct {
		round  int
		lo, hi time.Duration
	}{
		{1, 25 * time.Millisecond, 50 * time.Millisecond},
		{2, 50 * time.Millisecond, 100 * time.Millisecond},
		{3, 100 * time.Millisecond, 200 * time.Millisecond},
		{10, 500 * time.Millisecond, time.Second},
		{1000, 500 * time.Millisecond, time.Second},
	} {
		if got, want := backoff(tc.round, base, max, lo), tc.lo; got != want {
			t.Errorf("backoff(round %d) low = %v, want %v", tc.round, got, want)
		}
		if got, want := backoff(tc.round, base, max, hi), tc.hi; got != want {
			t.Errorf("backoff(round %d) high = %v, want %v", tc.round, got, want)
		}
	}
}
