package workload

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/chaos/check"
	"github.com/lodestone-kv/lodestone/chaos/history"
	"github.com/lodestone-kv/lodestone/client"
)

// DialOptions must be on every connection the workloads use. They install
// the client's RPC trace handler, so each write's client.RPCTrace says
// what went over the wire (request sent, server status received); the
// verdict drawn from it is the harness's own (classifyWrite).
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{client.RPCTraceDialOption()}
}

// ACLRules is the policy of the token the workloads send on a secure
// cluster: exactly what they do, so every operation also passes the
// server's authorization. Keys under the workload prefixes (read, write,
// CAS, watch, range, lock acquire and release), the catalog node the lock
// sessions live on, and sessions on that node. No operator, ACL, service
// or other key rights: the harness's membership changes and fault hooks
// use the management token.
var ACLRules = fmt.Sprintf(`key_prefix %q { policy = "write" }
key_prefix %q { policy = "write" }
node %q { policy = "write" }
session %q { policy = "write" }
`, check.Prefix, check.LockPrefix, LockNode, LockNode)

// classifyWrite turns a write's error into a Jepsen outcome, relying only
// on the server's documented promise (server/doc.go, client/doc.go):
// Unavailable from a server means "not applied".
//
//   - no error: OK;
//   - the server answered FailedPrecondition: Fail, and the CAS condition
//     did not hold (mismatch);
//   - the server answered a code that rejects before proposing
//     (Unavailable, InvalidArgument, NotFound, ResourceExhausted, and
//     PermissionDenied, which only the ACL door in front of every service
//     gives, server/authz.go): Fail;
//   - the request never left the client: Fail;
//   - anything else (timeout, reset, Aborted, Internal, ...): Info.
func classifyWrite(err error, t *client.RPCTrace) (typ string, mismatch bool) {
	if err == nil {
		return history.OK, false
	}
	code := status.Code(err)
	switch {
	case t.Responded() && code == codes.FailedPrecondition:
		return history.Fail, true
	case t.Responded():
		switch code {
		case codes.Unavailable, codes.InvalidArgument, codes.NotFound, codes.ResourceExhausted, codes.PermissionDenied:
			return history.Fail, false
		}
		return history.Info, false
	case !t.Sent():
		return history.Fail, false
	}
	return history.Info, false
}

// errText is the recorded error: the gRPC code and message.
func errText(err error) string {
	if err == nil {
		return ""
	}
	if st, ok := status.FromError(err); ok {
		return st.Code().String() + ": " + st.Message()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "DeadlineExceeded"
	}
	return err.Error()
}
