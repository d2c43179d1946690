// Package adminui is the gateway's web UI, served under /ui/ on its admin
// port: the routes, each service's pools and origins (in-flight requests,
// latency, ejection state, subset membership), the shed and retry-budget
// counters and how stale the registry feed is. It reads the gateway
// through Source, a snapshot of the routing table plus the gateway's
// Prometheus registry, and knows nothing else of it.
//
// The page's live region follows an event stream that re-renders when the
// routing table or the registry link changes and once a second for the
// counters (internal/webui); charts are inline SVG. With an admin token
// set (--admin-token-file), the UI asks for it once and keeps it in an
// HttpOnly, SameSite=Strict cookie, as /routes asks for it per request.
package adminui
