// Package checks runs health checks: the one implementation behind
// `lodestone agent` and behind a server's own /v1/agent endpoints.
//
// # What it owns
//
// How a check is defined (Definition: Consul's AgentServiceCheck, as
// clients send it), how a definition becomes a catalog record
// (Definition.Catalog) and how a record becomes something that runs
// (Compile: a Spec), what a check's status is (Check: status, output,
// TTL deadline, how long it has been critical) and the goroutine that
// runs it: HTTP, TCP, gRPC health and script probes every interval, and
// the TTL timer.
//
// # What it refuses to know
//
// The registry, Raft and who is told about a result. A running check calls
// its owner's Hooks.Result after each run; the owner decides what to
// write (the agent's sync loop, the server's local agent), and when a
// service whose check stayed critical too long is deregistered
// (Check.Reapable says when).
//
// # Shape
//
// Check's state methods take the time as an argument and hold no I/O, so
// they are tested with a fake clock; Start adds the goroutine. A Check
// guards its state with its own mutex and never calls its owner while
// holding it, so an owner may read a Check under its own lock.
//
// # Consul's rules, kept
//
//   - HTTP: 2xx passing, 429 warning, anything else critical; a fresh
//     connection per probe, redirects not followed.
//   - TCP: a connection passing, else critical.
//   - gRPC: the standard health service (grpc.health.v1) answering
//     SERVING is passing, anything else critical; "host:port/service"
//     asks about one service.
//   - Script (Args): exit 0 passing, 1 warning, other critical, output
//     capped at 4 KiB; refused unless the owner enables script checks.
//   - TTL: critical once the TTL passes without a report.
//   - A check starts critical unless its definition gives a status.
//   - Intervals below Options.MinInterval (Consul: 1s) and
//     DeregisterCriticalServiceAfter below Options.MinDeregisterAfter
//     (Consul: 1m) are raised to them, with a warning.
package checks
