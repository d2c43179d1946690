// Package gateway is Lodestone's edge proxy: it routes HTTP requests by
// host and path prefix to the healthy instances of services it learns
// from the registry, and keeps doing so when origins are slow, when the
// registry churns, and when the registry is down.
//
// (The demo service `lodestone dev` uses lives in gateway/demo, and
// hand-written fakes in gateway/gatewaytest; docs/architecture.md shows
// where the gateway sits among the other components.)
//
// # What it owns
//
//   - The routing table: routes (static from a JSON file, plus registry
//     routes that override them by name) and, per service, its healthy
//     instances on a Van der Corput ring cut into subsets (ring.go). It is
//     immutable; the current version sits in an atomic.Pointer. Requests
//     Load it and take no lock that an update takes. One goroutine applies
//     a Source's updates with table.apply, a plain method (no goroutines,
//     no I/O, no clock) that returns the next version and a diff, then
//     swaps it in and cleans up what the diff says is gone.
//   - Origins and pools: every instance is an origin (in-flight count,
//     concurrency limit, outlier state); every (shard, origin) pair in a
//     shard's subset is a pool with its own http.Transport: HTTP/1.1
//     keep-alive, h2c or TLS with ALPN (HTTP/2 multiplexed when the origin
//     offers h2).
//   - Protection: admission (MaxInFlight, MaxQueueTime: the excess gets
//     503 + Retry-After at once), power of two choices on in-flight
//     requests within the subset, per-origin concurrency limits, outlier
//     ejection with growing ejection times and a cap on the ejected share,
//     connect / response-header / idle timeouts on every attempt, and
//     retries of idempotent requests under a retry budget.
//   - The admin listener (/healthz, /readyz, /metrics, /routes) on its own
//     port and http.Server.
//   - The persisted table (StateDir, crash-safe; see persist.go) and the
//     staleness it reports while the registry is unreachable.
//
// # What it refuses to know
//
// Nothing of Raft or the store: a Source delivers instances and routes.
// CatalogSource (the default) takes the catalog's instances whose
// aggregated health is passing, through the Go client's catalog reads and
// a catalog watch, and routes from KV; KVSource reads both from KV keys.
// Both follow the registry over the client's one watch stream and share
// the reconnect, resume and reload logic (feed.go). No per-request state
// survives a request except counters in origins and pools.
//
// Nor how HTTP/1.1 is read and written on its fast paths: that is
// gateway/internal/h1's. Its Server serves the proxy listener's client
// connections and hands those it does not serve plainly to a net/http
// server (proxySrv); its Conn is one pooled keep-alive connection to an
// HTTP/1.1 origin. The gateway keeps the pools and decides which
// requests take them (fastpath.go).
//
// # How a request runs
//
//  1. Admission: one atomic add while under MaxInFlight; otherwise wait in
//     a FIFO at most MaxQueueTime, then 503 with Retry-After.
//  2. Route: Load the table, match host and path (exact host, then
//     wildcard, then any host; longest prefix within each).
//  3. Origin: a random shard; power of two choices among the available
//     (not ejected, under their limit) origins of its subset; the whole
//     service as a fallback when the subset has none; 503 when nothing is
//     available.
//  4. Attempt: the origin's pool sends the request with the attempt's
//     response-header timeout; the body streams back with the idle
//     timeout between reads. A connect failure, a header timeout or a
//     502/503/504 is retried on another origin when the request is
//     idempotent, has no body, and the budget allows. Every attempt feeds
//     the origin's outlier state.
//
// # Caller's duties
//
//  1. Build a Config (DefaultConfig, or DevConfig for `lodestone dev`) with
//     a Source, or Registry endpoints and Instances (catalog or kv) for a
//     source New builds.
//  2. New, then Start; or Run, which also waits for ctx and closes.
//  3. Close when done: it stops the listeners (in-flight requests get up to
//     5s), the source and the persister, writes the table one last time,
//     and closes every origin connection.
package gateway
