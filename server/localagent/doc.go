// Package localagent is a server as the Consul agent of its own catalog
// node: the services and checks registered through the server's
// /v1/agent endpoints, which it keeps, persists and runs as `lodestone
// agent` runs its own.
//
// # What it owns
//
// The local services and checks (registrations, as clients sent them),
// their file in the data dir, the running checks (package checks, the
// same code as the agent's), and every catalog write about them: the
// registrations, the check transitions, maintenance checks
// (_node_maintenance, _service_maintenance:<id>) and the deregistration
// of a service whose check stayed critical past its
// DeregisterCriticalServiceAfter.
//
// # What it refuses to know
//
// HTTP, tokens and Raft. The Consul API checks the caller's permission
// and calls an operation here; the operation writes with the server's
// authority through Config.Apply, the server's write path.
//
// # Writes only transitions
//
// Every operation (register, deregister, a TTL report, maintenance)
// writes to the catalog before it returns, so the caller reads its own
// write, as Consul's agent syncs before it answers. A running check's
// results change nothing in the catalog until its status changes; then
// one goroutine writes that one status, one Raft entry per transition
// (flaps faster than a write collapse into one). Output changes alone are
// not written. A write that fails is retried with back-off; one the
// catalog refuses because it lost the check re-registers the service.
//
// # What survives what
//
//   - A leader change: the checks run on the server that registered them,
//     whoever leads; writes wait for the new leader and are retried.
//   - A restart of this server: registrations are kept in
//     <data-dir>/agent/local.json (written crash-safely before each
//     catalog write). On start the checks run again; each check takes
//     the status the catalog holds (read after catching up with the
//     leader), so an unchanged result writes nothing, and what the
//     catalog lost is registered again (anti-entropy, also every
//     AntiEntropyInterval). A TTL check gets a full TTL from the start.
//   - The loss of this server: its node's checks stop changing; with
//     gossip on, the leader marks the node's serfHealth critical.
//
// Services on this node that were not registered here (through
// /v1/catalog/register) are left alone, unlike Consul's anti-entropy,
// which would remove them.
package localagent
