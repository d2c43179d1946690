// Package server runs one Lodestone registry node: a Raft member that
// stores the replicated state machine and serves it over gRPC and HTTP.
//
// # What it owns
//
// The client-facing gRPC services (KV, Cluster, Watch, Catalog, Session,
// Admin), the HTTP port (the Consul-compatible API in server/consulapi,
// parked blocking queries in server/httppark, /metrics, /healthz,
// /readyz), gossip reconcile, session TTLs and admission control. It wires
// a raftnode.Node to a peer.Transport and serves both; it reaches the
// Raft loop only through the raftnode face, and the peer port only
// through peer.Port. Server.Ready is the one readiness rule (a leader
// known, what was committed applied): /readyz answers with it, and so
// does the systemd readiness notice of cmd/lodestone.
//
// # Requests
//
// Every state change goes through one path (write.go): stamp, validate,
// raftnode's Propose, check the result. Raft forwards a follower's
// proposal to the leader, and the proposer answers once it has applied
// the entry itself, so a caller reading from the same node sees its
// write. Linearizable reads use ReadIndex; stale reads are served at
// once; Consul's default-mode reads use LeaderRead. Errors reach clients
// through internal/rpcstatus: Unavailable always means the request was
// not applied and may be retried; DeadlineExceeded after a write leaves
// its outcome unknown.
//
// # Catalog and sessions
//
// The Catalog and Session gRPC services and the Consul-compatible HTTP API
// (server/consulapi) write through write (write.go), which does the store's
// proposer duties (store/doc.go): stamp the command with this node's
// clock, give a new session a fresh UUID, validate, propose, and turn a
// rejection into FailedPrecondition (HTTP: Consul's codes). Blocking reads
// wait on the watch hub for the events of exactly what they read and
// re-check the store's index for it on every wake-up (consulapi.Block).
// On HTTP/1.1 the wait holds no goroutine: the request is parked
// (server/httppark) as a hub watcher and a timer on its hijacked
// connection, and run again to answer once it changed or timed out; the
// lot then reads the connection's next blocking query itself and hands
// anything else back to the http.Server. --no-parking turns that off.
//
// # Watch streams
//
// One goroutine per Watch stream sends everything: the hub puts the
// stream's watchers that have something on the stream's Ready list, and
// the goroutine drains them at the next point of a process-wide grid
// (Config.WatchDeliveryInterval, --watch-delivery-interval, 5 ms by
// default), so a stream sends at most one message per interval and the
// streams of a connection hand gRPC's writer their messages together. A
// stream that sent less than --watch-busy-delivery-interval (10 ms) ago
// waits for that coarser grid instead: one fed by every write sends a
// message per 10 ms, while one that sends now and then keeps 5 ms. A
// stream whose client set WatchCreate.grouped gets one response per round
// with a group per woken watch; others get one response per watch and
// batch.
//
// # Live settings
//
// Reload (live.go) swaps the limits, body sizes, watch caps and per-client
// connection caps of LiveConfig in while serving: readers load one atomic
// pointer to an immutable LiveConfig per request or accepted connection,
// so every other Config field is read from the Config the server started
// with, which never changes.
//
// Session TTLs are the leader's job: while this node leads, one goroutine
// (runSessionTTL) sleeps until the earliest TTL deadline the store
// reports, wakes early for session events, and proposes SessionInvalidate
// with the time it judged expiry at; the store re-checks that time against
// renewals committed first. A new leader re-arms from the moment it saw
// its own election, so every session gets a full TTL × 2 after a leader
// change (erring long). The goroutine stops on Close.
package server
