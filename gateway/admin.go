package gateway

import (
	"crypto/subtle"

	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/lodestone-kv/lodestone/gateway/adminui"
	"github.com/lodestone-kv/lodestone/internal/token"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// adminHandler serves the admin listener:
//
//	/healthz  200 while the process serves
//	/readyz   200 once a table came from the registry or the state dir,
//	          503 before (a gateway with a stale table is still ready: it
//	          serves the last known good routes)
//	/metrics  the gateway's own Prometheus registry
//	/routes   the current table as JSON (routes, services, subsets, origins)
//	/ui/      the web UI (gateway/adminui), behind the admin token if one is set
//
// NB: the admin listener has its own http.Server and so its own accept
// loop and connection goroutines; its handlers read the table through the
// atomic pointer and take no lock the proxy takes, so they answer while
// the proxy is saturated by slow origins (the Riot/Zuul failure: health
// checks starved behind worker pools).
func (g *Gateway) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !g.Ready() {
			http.Error(w, "not ready: no routing table yet (waiting for the registry)", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /routes", func(w http.ResponseWriter, r *http.Request) {
		if !g.adminAllowed(r) {
			http.Error(w, "Permission denied: /routes needs the gateway's admin token (Authorization: Bearer or X-Consul-Token)", http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(g.describe())
	})
	if u, err := adminui.New(uiSource{g}, g.log.With("component", "adminui")); err != nil {
		g.log.Error("gateway: admin UI not served", "err", err)
	} else {
		u.Register(mux)
	}
	return mux
}

// TableView is /routes' JSON: what the gateway routes by now.
type TableView struct {
	Index            uint64                 `json:"index"`
	Connected        bool                   `json:"connected"`
	StalenessSeconds float64                `json:"staleness_seconds"`
	Shards           int                    `json:"shards"`
	Routes           []RouteView            `json:"routes"`
	Services         map[string]ServiceView `json:"services"`
}

// RouteView is one route and where it came from ("file" or "registry").
type RouteView struct {
	Route
	From string `json:"from"`
}

// ServiceView is one service's ring.
type ServiceView struct {
	Subsets     int          `json:"subsets"`
	Replication int          `json:"replication"`
	Origins     []OriginView `json:"origins"`
}

// OriginView is one origin's state.
type OriginView struct {
	ID           string     `json:"id"`
	Addr         string     `json:"addr"`
	Protocol     string     `json:"protocol"`
	Seq          uint32     `json:"seq"`
	Ring         float64    `json:"ring"`
	Subset       int        `json:"subset"`
	InFlight     int64      `json:"in_flight"`
	EjectedUntil *time.Time `json:"ejected_until,omitempty"`
}

func (g *Gateway) describe() TableView {
	t := g.table.Load()
	now := g.clock.Now()
	v := TableView{
		Index: t.index, Connected: g.connected.Load(), StalenessSeconds: g.Staleness().Seconds(),
		Shards: g.cfg.Shards, Services: map[string]ServiceView{},
	}
	for _, e := range t.router.all {
		from := "registry"
		if t.routes[e.Name] != e {
			from = "file"
		}
		v.Routes = append(v.Routes, RouteView{Route: e.Route, From: from})
	}
	for _, name := range slices.Sorted(maps.Keys(t.services)) {
		s := t.services[name]
		sv := ServiceView{Subsets: 1 << s.bits, Replication: g.cfg.Shards >> s.bits}
		for _, p := range s.fallback {
			o := p.origin
			ov := OriginView{
				ID: o.inst.ID, Addr: o.host, Protocol: o.inst.protocol(), Seq: o.seq, Ring: vdc(o.seq),
				Subset: subsetOf(o.seq, s.bits), InFlight: o.inflight.Load(),
			}
			if u := o.ejectedUntil.Load(); u != 0 && now.UnixNano() < u {
				tu := time.Unix(0, u)
				ov.EjectedUntil = &tu
			}
			sv.Origins = append(sv.Origins, ov)
		}
		v.Services[name] = sv
	}
	return v
}

// adminAllowed reports whether r carries the admin token, when one is set.
// NB: constant-time, so the comparison leaks nothing of the token.
func (g *Gateway) adminAllowed(r *http.Request) bool {
	want := g.cfg.AdminToken
	return want == "" || subtle.ConstantTimeCompare([]byte(token.FromRequest(r)), []byte(want)) == 1
}
