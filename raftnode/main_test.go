package raftnode

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any leave a goroutine behind: a
// Node's loop, log writer and snapshot encoders end with Stop, and the
// interaction environment runs none of its own.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
