package agent

import (
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
)

// check is one running check (package checks) and what the registry was
// last told about it.
type check struct {
	*checks.Check
	// remote is the status the registry was last told (0: never). The
	// agent's mutex guards it.
	remote lodestonepb.HealthStatus
}

// dirty reports whether the registry must be told this check's status.
func (c *check) dirty() bool {
	st, _ := c.Status()
	return st != c.remote
}

// catalog returns the catalog record for the check on node, with its
// current status.
func (c *check) catalog(node string) *lodestonepb.Check {
	rec := proto.CloneOf(c.Spec().Record)
	rec.Node = node
	rec.Status, rec.Output = c.Status()
	return rec
}
