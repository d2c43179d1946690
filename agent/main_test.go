package agent

import (
	"testing"

	"go.uber.org/goleak"
)

// NB: memberlist's probe goroutine outlives Shutdown by up to one probe
// interval: it waits on its ack channel until the probe's own timer fires,
// and memberlist offers no way to wait for it. Every other goroutine must
// be gone.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}
