package watch_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: the
// Hub's shards and progress timer, and Watch's context hooks, must all be
// gone after Close (STYLE 17, 24).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
