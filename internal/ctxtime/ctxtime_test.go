package ctxtime_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/internal/ctxtime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSleep(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()

	for _, tc := range []struct {
		name string
		ctx  context.Context
		d    time.Duration
		want error
	}{
		{"elapses", context.Background(), 5 * time.Millisecond, nil},
		{"zero duration", context.Background(), 0, nil},
		{"negative duration", context.Background(), -time.Second, nil},
		{"canceled before", canceled, time.Hour, context.Canceled},
		// An ended ctx wins over a timer that would fire at once too.
		{"canceled before, zero duration", canceled, 0, context.Canceled},
		{"deadline passed before", expired, time.Hour, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			err := ctxtime.Sleep(tc.ctx, tc.d)
			if got, want := err, tc.want; !errors.Is(got, want) {
				t.Fatalf("Sleep(%v) = %v, want %v", tc.d, got, want)
			}
			if tc.want == nil {
				if got, want := time.Since(start), tc.d; got < want {
					t.Fatalf("Sleep returned after %v, want at least %v", got, want)
				}
			}
		})
	}
}

// TestSleepEndsWithContext checks that a ctx ending before d ends the
// sleep with the ctx's error: one canceled by another goroutine, and one
// whose deadline comes long before d.
func TestSleepEndsWithContext(t *testing.T) {
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- ctxtime.Sleep(ctx, time.Hour) }()
		cancel()
		select {
		case err := <-done:
			if got, want := err, context.Canceled; !errors.Is(got, want) {
				t.Fatalf("Sleep = %v, want %v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Sleep did not return after its ctx was canceled")
		}
	})
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		defer cancel()
		if got, want := ctxtime.Sleep(ctx, time.Hour), context.DeadlineExceeded; !errors.Is(got, want) {
			t.Fatalf("Sleep = %v, want %v", got, want)
		}
	})
}
