package gateway

import (
	"context"
	"fmt"
	"sync"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

// CatalogSource is the Source over Lodestone's catalog: every service's
// instances come from the catalog (nodes, services, checks; registered
// through the Catalog gRPC service, the Consul HTTP API or agents) and
// routes from KV under <Prefix>routes/<name> as for a KVSource.
//
// It loads the routes (one paged Range, whose applied index I is the
// snapshot's) and every service's instances with their health (Services,
// then Health of each), delivers them as one Reset at I, then follows two
// watches from I on the client's one watch stream: the catalog's
// service-instance events (client.WatchCatalogServices) and the routes
// prefix. Every event carries the instance's whole state, so changes made
// while the snapshot was read are replayed over it and converge. A broken
// watch resumes from the last index delivered; only an index the registry
// no longer retains forces another full load.
//
// Routable: an instance receives traffic iff its aggregated health (its
// own checks and its node's node-level checks, Consul's rules) is
// passing, or warning when RouteWarning is set. Any critical check, or a
// status the gateway does not know, takes it out. Address: the service's
// address, else its node's. Meta: the service's meta (protocol,
// tls_server_name as for Instance).
//
// Update.Index is the catalog watch's index. Routes follow their own watch
// and are applied when they arrive, so Gateway.WaitIndex covers catalog
// changes, not route changes. Resuming a new Run from an index (a table
// persisted by an earlier process) re-reads the routes (few keys) as one
// ResetRoutes update and resumes the instances; within one Run, a broken
// route watch resumes like the catalog one.
type CatalogSource struct {
	kv  *KVSource // routes: read, decode, probe, retry settings
	cfg CatalogSourceConfig
}

var _ Source = (*CatalogSource)(nil)

// CatalogSourceConfig configures a CatalogSource.
type CatalogSourceConfig struct {
	// KVSourceConfig holds the registry settings shared with KVSource:
	// Prefix (routes under Prefix+"routes/"; default "gateway/"),
	// GiveUpAfter, BackoffBase, BackoffMax, PageSize (of route reads) and
	// Logger, with the same defaults.
	KVSourceConfig
	// RouteWarning routes to instances whose aggregated status is warning.
	// Default false: only passing instances get traffic (Consul's
	// ?passing, and what Traefik and Fabio do), so a check that reports
	// degradation drains the instance; a service whose instances all warn
	// then gets 503s. Set it to follow Consul DNS (which only drops
	// critical).
	RouteWarning bool
}

// DefaultCatalogSourceConfig returns the defaults documented on each
// field.
func DefaultCatalogSourceConfig() CatalogSourceConfig {
	return CatalogSourceConfig{KVSourceConfig: DefaultKVSourceConfig()}
}

// NewCatalogSource returns a source reading through c (which the caller
// owns and closes).
func NewCatalogSource(c *client.Client, cfg CatalogSourceConfig) (*CatalogSource, error) {
	kv, err := NewKVSource(c, cfg.KVSourceConfig)
	if err != nil {
		return nil, err
	}
	cfg.KVSourceConfig = kv.cfg
	return &CatalogSource{kv: kv, cfg: cfg}, nil
}

// Stats returns how the source (re)joined the registry so far.
func (s *CatalogSource) Stats() SourceStats { return s.kv.stats() }

// RouteKey returns the KV key of a registry route.
func (s *CatalogSource) RouteKey(name string) string { return s.kv.RouteKey(name) }

// PutRoute stores a registry route and returns the write's index.
func (s *CatalogSource) PutRoute(ctx context.Context, r Route) (uint64, error) {
	return s.kv.PutRoute(ctx, r)
}

// DeleteRoute removes a registry route and returns the write's index.
func (s *CatalogSource) DeleteRoute(ctx context.Context, name string) (uint64, error) {
	return s.kv.DeleteRoute(ctx, name)
}

// Run implements Source.
func (s *CatalogSource) Run(ctx context.Context, from uint64, sink Sink) error {
	return s.kv.run(ctx, &catalogFeed{s: s, last: from}, from == 0, sink)
}

// catalogFeed is one Run of a CatalogSource.
type catalogFeed struct {
	s         *CatalogSource
	last      uint64 // catalog index delivered last: the resume point
	routeLast uint64 // routes read or watched up to here; 0: read them again
}

func (f *catalogFeed) resumeIndex() uint64             { return f.last }
func (f *catalogFeed) what() string                    { return "catalog services and " + f.routes() }
func (f *catalogFeed) probe(ctx context.Context) error { return f.s.kv.probe(ctx) }
func (f *catalogFeed) routes() string                  { return f.s.cfg.Prefix + "routes/" }

// reload reads the routes, then every service's instances, as one Reset
// at the routes read's (applied) index.
func (f *catalogFeed) reload(ctx context.Context) (Update, error) {
	u := Update{Reset: true}
	idx, err := f.s.kv.read(ctx, f.routes(), &u)
	if err != nil {
		return Update{}, err
	}
	// NB: catalog reads' Header.Index is the index of the data read
	// (Consul's X-Consul-Index), possibly far older than the applied
	// index; a watch from it could fall outside the retained history.
	// The routes read's applied index comes first, so every change after
	// it is replayed.
	svcs, err := f.s.kv.c.Services(ctx)
	if err != nil {
		return Update{}, fmt.Errorf("list catalog services: %w", err)
	}
	n := 0
	for _, sum := range svcs.GetServices() {
		resp, err := f.s.kv.c.Health(ctx, sum.GetName(), client.HealthFilter{})
		if err != nil {
			return Update{}, fmt.Errorf("read catalog service %q: %w", sum.GetName(), err)
		}
		set := ServiceSet{Service: sum.GetName()}
		for _, h := range resp.GetInstances() {
			set.Instances = append(set.Instances, f.s.instance(h))
		}
		n += len(set.Instances)
		u.Sets = append(u.Sets, set)
	}
	f.s.kv.log.Info("gateway: loaded routes and catalog instances from the registry", "index", idx,
		"services", len(u.Sets), "instances", n, "routes", len(u.Routes))
	f.last, f.routeLast = idx, idx
	return u, nil
}

// batch is one result of a watch's Next, tagged with the watch.
type batch struct {
	routes bool
	b      client.WatchBatch
	err    error
}

// follow runs the catalog and route watches from their resume points until
// either ends, delivering every batch as it arrives (catalog changes and
// route changes are independent, so they need no merge by index).
func (f *catalogFeed) follow(ctx context.Context, sink Sink) error {
	if f.routeLast == 0 {
		u := Update{ResetRoutes: true}
		idx, err := f.s.kv.read(ctx, f.routes(), &u)
		if err != nil {
			return err
		}
		u.Index = f.last
		sink.Apply(u)
		f.routeLast = idx
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	kv := f.s.kv
	cw := kv.c.Watch(ctx, "", client.WatchCatalogServices(), client.FromIndex(f.last),
		client.WithProgressNotify(), client.WatchGiveUpAfter(kv.cfg.GiveUpAfter))
	rw := kv.watch(ctx, f.routes(), f.routeLast)
	defer cw.Close()
	defer rw.Close()
	out := make(chan batch)
	pump := func(w *client.Watch, routes bool) {
		for {
			b, err := w.Next(ctx)
			select {
			case out <- batch{routes: routes, b: b, err: err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}
	wg.Go(func() { pump(cw, false) })
	wg.Go(func() { pump(rw, true) })
	for {
		var in batch
		select {
		case in = <-out:
		case <-ctx.Done():
			return ctx.Err()
		}
		if in.err != nil {
			if in.routes {
				return fmt.Errorf("watch %s: %w", f.routes(), in.err)
			}
			return fmt.Errorf("watch catalog services: %w", in.err)
		}
		if in.routes {
			u := Update{Index: f.last}
			for _, ev := range in.b.Events {
				kv.decode(&u, ev.GetType(), ev.GetKv())
			}
			f.routeLast = in.b.Index
			if len(u.Routes) > 0 {
				sink.Apply(u)
			}
			continue
		}
		u := Update{Index: in.b.Index}
		for _, ev := range in.b.Events {
			e, err := client.DecodeServiceInstanceEvent(ev)
			if err != nil {
				kv.log.Warn("gateway: ignoring catalog event", "err", err)
				continue
			}
			ch := InstanceChange{Service: e.Service, ID: instanceID(e.Node, e.ID)}
			if e.Health != nil {
				in := f.s.instance(e.Health)
				ch.Instance = &in
			}
			u.Instances = append(u.Instances, ch)
		}
		sink.Apply(u)
		f.last = in.b.Index
	}
}

// instanceID names a catalog instance within its service: service ids are
// unique per node only.
func instanceID(node, id string) string { return node + "/" + id }

// instance converts a catalog instance with its health.
func (s *CatalogSource) instance(h *lodestonepb.ServiceHealth) Instance {
	svc, node := h.GetService(), h.GetNode()
	in := Instance{
		Service: svc.GetName(),
		ID:      instanceID(svc.GetNode(), svc.GetId()),
		Address: svc.GetAddress(),
		Port:    int(svc.GetPort()),
		Healthy: s.routable(h.GetStatus()),
		Meta:    svc.GetMeta(),
	}
	if in.Address == "" {
		in.Address = node.GetAddress()
	}
	return in
}

// routable reports whether an aggregated status gets traffic.
func (s *CatalogSource) routable(st lodestonepb.HealthStatus) bool {
	switch st {
	case lodestonepb.HealthStatus_HEALTH_PASSING:
		return true
	case lodestonepb.HealthStatus_HEALTH_WARNING:
		return s.cfg.RouteWarning
	default:
		return false
	}
}
