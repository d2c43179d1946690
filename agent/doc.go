// Package agent is `lodestone agent`: the process that runs beside
// services, keeps them registered in the catalog, runs their health checks
// locally and gossips its own liveness.
//
// # What it owns
//
// The node's local state (its services and checks, as loaded from a
// config file or registered through the Consul-compatible HTTP API on
// /v1/agent/..., beside /metrics and /healthz), its checks (package checks, which servers share: HTTP,
// TCP, gRPC, TTL, and scripts when enabled), the sync loop that writes to
// the registry through the gRPC Catalog service, the reaper that
// deregisters a service whose check stayed critical past its
// DeregisterCriticalServiceAfter, and the agent's membership in the
// gossip pool (package gossip).
//
// # What it refuses to know
//
// Raft and the catalog's storage. The leader, not the agent, marks the
// node failed when the agent dies (the serfHealth check, server/gossip.go):
// a dead agent cannot report its own death.
//
// # Writes only transitions
//
// local is the logic, with no goroutines or I/O: it holds what the
// registry should say (node, services, check statuses) next to what the
// registry was last told, and next() returns the one write that closes the
// gap, or nothing. A check that keeps its status writes nothing however
// often it runs; a new service is registered once its HTTP and TCP checks
// have run once, so it goes in with real statuses instead of "critical
// then passing". Output changes alone are not written (Consul rate-limits
// them instead; we drop them). A failed write is retried with back-off;
// a refused update (the registry lost the check) re-registers the service.
// Every AntiEntropyInterval the agent reads its node back (reads, no Raft
// entries) and marks whatever the registry lost or changed for writing.
//
// # Stopping
//
// Close stops the checks and the sync loop, then, by Config.OnStop: "leave"
// announces the departure in the pool (the leader marks the node's
// serfHealth critical with "left"), "deregister" leaves and then removes
// the node with its services, checks and sessions from the catalog.
// kill -9 does neither: the pool declares the node failed within the
// gossip detection time and the leader marks it critical.
package agent
