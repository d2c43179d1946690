package gossip

import (
	"errors"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func errorsAs(err error, target any) bool { return errors.As(err, target) }
