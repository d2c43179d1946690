package gateway

import (
	"context"
	"fmt"
	"net"
	"strconv"
)

// Source feeds the gateway the registry's view: every service's instances
// and the registry-held routes, as a stream of Updates with an index.
//
// Implementations: CatalogSource (the catalog's healthy instances, routes
// from KV), KVSource (instances and routes as JSON under a KV prefix) and
// gatewaytest.Source (in memory, for unit tests).
type Source interface {
	// Run streams updates to sink until ctx ends, then returns ctx.Err().
	//
	// from is the index of the state the gateway already holds (a table
	// persisted by an earlier run, or the last update of an earlier Run);
	// 0 means none. With from > 0, Run resumes: it delivers every change
	// with index > from as deltas, and falls back to one Update with Reset
	// only when it cannot (the registry no longer retains from). With
	// from == 0 the first Update is a Reset.
	//
	// Run calls sink from the goroutine that called Run, one call at a
	// time, in index order; the sink must not block for long (the gateway's
	// sink swaps a pointer). Run retries transient registry failures itself
	// (with backoff and jitter, resuming from the last index it delivered)
	// and reports them with sink.SetConnected(false, err). It returns
	// another error only when retrying cannot help (for instance the
	// registry refuses the watch); the caller may call Run again later.
	//
	// A Source need not support concurrent Runs.
	Run(ctx context.Context, from uint64, sink Sink) error
}

// Sink receives what a Source streams. The gateway implements it.
type Sink interface {
	// Apply applies one update. The Update and everything it references
	// belong to the sink after the call.
	Apply(Update)
	// SetConnected reports that the source reached the registry
	// (connected, err nil) or lost it (not connected, err says why). While
	// not connected the gateway serves its last table and its staleness
	// grows.
	SetConnected(connected bool, err error)
}

// Update is one step of the registry's state.
//
// Without Reset it is a delta: Sets replace the listed services' instance
// sets whole, then Instances and Routes upsert (non-nil) or remove (nil)
// single entries. With Reset it is the whole state: every service and
// registry route not mentioned is removed (static routes from the routes
// file stay). An Update with no changes and no Reset is a progress
// notification: the table is current as of Index.
type Update struct {
	// Index is the registry index the update brings the gateway to; it
	// never decreases. Resume a later Run from it.
	Index uint64
	// Reset makes the update the complete state.
	Reset bool
	// ResetRoutes makes Routes the complete set of registry routes (every
	// registry route not upserted is removed) and leaves instances as
	// deltas: a source that re-reads its routes but resumes its instances
	// (CatalogSource after a cold start) sends it.
	ResetRoutes bool
	// Sets are full instance sets of single services (CatalogSource's
	// initial load produces these); an empty set removes the service's
	// instances.
	Sets []ServiceSet
	// Instances are per-instance changes (watch events produce these).
	Instances []InstanceChange
	// Routes are per-route changes of registry-held routes.
	Routes []RouteChange
}

// IsProgress reports whether u carries no change.
func (u Update) IsProgress() bool {
	return !u.Reset && !u.ResetRoutes && len(u.Sets) == 0 && len(u.Instances) == 0 && len(u.Routes) == 0
}

// ServiceSet is the full set of one service's instances.
type ServiceSet struct {
	Service   string
	Instances []Instance
}

// InstanceChange upserts (Instance non-nil) or removes (nil) the instance
// Service/ID.
type InstanceChange struct {
	Service  string
	ID       string
	Instance *Instance
}

// RouteChange upserts (Route non-nil) or removes (nil) the registry route
// Name.
type RouteChange struct {
	Name  string
	Route *Route
}

// Instance is one origin of a service. Its JSON form is the KV value under
// gateway/instances/<service>/<id>:
//
//	{"address": "10.0.0.7", "port": 8080, "healthy": true, "meta": {"protocol": "h2c"}}
//
// Meta keys the gateway reads:
//
//	protocol         "http" (default: HTTP/1.1 keep-alive), "h2c" (HTTP/2
//	                 over cleartext, prior knowledge) or "https" (TLS; ALPN
//	                 offers h2 and http/1.1)
//	tls_server_name  the name to verify the origin's certificate against
//	                 (default: the address)
//
// Only healthy instances receive traffic.
type Instance struct {
	// Service and ID name the instance; a KVSource takes them from the
	// key, not the value.
	Service string            `json:"service,omitempty"`
	ID      string            `json:"id,omitempty"`
	Address string            `json:"address"`
	Port    int               `json:"port"`
	Healthy bool              `json:"healthy"`
	Meta    map[string]string `json:"meta,omitempty"`
}

// HostPort returns the instance's dial address.
func (in Instance) HostPort() string {
	return net.JoinHostPort(in.Address, strconv.Itoa(in.Port))
}

// Protocols an origin may speak (Instance.Meta["protocol"]).
const (
	ProtocolHTTP  = "http"  // HTTP/1.1 over TCP, keep-alive pool
	ProtocolH2C   = "h2c"   // HTTP/2 over TCP (prior knowledge), multiplexed
	ProtocolHTTPS = "https" // TLS; ALPN picks h2 (multiplexed) or http/1.1
)

// protocol returns the instance's protocol, defaulting to HTTP/1.1.
func (in Instance) protocol() string {
	if p := in.Meta["protocol"]; p != "" {
		return p
	}
	return ProtocolHTTP
}

// Validate reports what is wrong with in, if anything.
func (in Instance) Validate() error {
	switch {
	case in.Address == "":
		return fmt.Errorf("instance %s/%s: empty address", in.Service, in.ID)
	case in.Port <= 0 || in.Port > 65535:
		return fmt.Errorf("instance %s/%s: port %d out of range", in.Service, in.ID, in.Port)
	}
	switch p := in.protocol(); p {
	case ProtocolHTTP, ProtocolH2C, ProtocolHTTPS:
	default:
		return fmt.Errorf("instance %s/%s: unknown protocol %q (use http, h2c or https)", in.Service, in.ID, p)
	}
	return nil
}

// sameEndpoint reports whether a and b would be reached the same way, so
// a re-registration that changes nothing keeps its origin, pools and
// ring position.
func sameEndpoint(a, b Instance) bool {
	if a.Address != b.Address || a.Port != b.Port || len(a.Meta) != len(b.Meta) {
		return false
	}
	for k, v := range a.Meta {
		if bv, ok := b.Meta[k]; !ok || bv != v {
			return false
		}
	}
	return true
}
