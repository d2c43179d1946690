// Package gossip is Lodestone's liveness layer: servers and agents join one
// memberlist pool (SWIM: random probes, indirect probes, suspicion with
// refutation) and every member learns which others are alive, failed or
// gone.
//
// # What it owns
//
// The memberlist instance (its UDP and TCP sockets on one host:port), the
// node metadata every member advertises (its role and name, see Meta), the
// optional AES gossip encryption key, retrying the initial join, and the
// Roster: this member's view of the pool with the time each member entered
// its current state. Prometheus metrics: members by state, membership
// events, join attempts.
//
// # What it refuses to know
//
// Raft, the catalog, gRPC and health checks. The server's leader turns the
// Roster into catalog writes (server/gossip.go); agents only need to be in
// the pool. A failed member here is a fact about the network, not a
// decision about services.
//
// # Shape
//
// Roster is the logic: plain methods with the time passed in, no locks,
// goroutines or I/O. Pool is the shell: memberlist's delegate callbacks feed
// the Roster under a mutex, one goroutine retries the join and forgets
// long-gone members, Changed signals (coalesced) that the Roster moved.
//
// # Caller's duties, in order
//
//  1. New(cfg): binds the sockets and starts memberlist; the pool holds
//     only this member.
//  2. Start(): begins the join retries (cfg.Join) and the forget timer.
//  3. Read Members() whenever Changed() fires, and periodically: events
//     coalesce, so a reader must diff the whole Roster, never count
//     signals.
//  4. To stop: Leave(timeout) for a graceful departure (others see
//     StateLeft), then Close(); Close alone looks like a crash to the
//     others (StateFailed after the detection time).
//
// # Detection time
//
// A member that dies is probed by some member within about
// (n-1)×ProbeInterval; the probe fails at the end of that ProbeInterval
// (a direct ping waits ProbeTimeout, indirect pings the rest), then it is
// suspected for SuspicionMult×max(1,log10 n)×ProbeInterval (up to
// SuspicionMaxTimeoutMult times that while confirmations are missing)
// before it is declared failed; the declaration reaches everyone by gossip
// within a few GossipIntervals. Config.DetectionBound adds these up.
//
// # Encryption
//
// With EncryptKey set (base64 of a 16, 24 or 32 byte AES key, as Consul's
// "encrypt"), every packet and stream is encrypted and unencrypted or
// wrongly keyed traffic is dropped: a member with another key (or none)
// cannot join and is never listed.
package gossip
