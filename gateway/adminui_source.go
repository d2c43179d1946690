package gateway

import (
	"context"
	"crypto/subtle"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lodestone-kv/lodestone/gateway/adminui"
)

// uiSource is what the admin UI (gateway/adminui) reads: a snapshot of the
// table (the same describe /routes answers with) and the registry. It
// takes no lock a request takes.
type uiSource struct{ g *Gateway }

var _ adminui.Source = uiSource{}

func (s uiSource) Snapshot() adminui.Snapshot {
	g := s.g
	v := g.describe()
	out := adminui.Snapshot{Index: v.Index, Connected: v.Connected, Ready: g.Ready(), Shards: v.Shards,
		Staleness: time.Duration(v.StalenessSeconds * float64(time.Second)),
		InFlight:  g.admit.inFlight(), MaxInFlight: g.cfg.MaxInFlight}
	for _, r := range v.Routes {
		out.Routes = append(out.Routes, adminui.Route{Name: r.Name, Host: r.Host, PathPrefix: r.PathPrefix, Service: r.Service,
			From: r.From, StripPrefix: r.StripPrefix})
	}
	for name, sv := range v.Services {
		svc := adminui.Service{Name: name, Subsets: sv.Subsets, Replication: sv.Replication}
		for _, o := range sv.Origins {
			ov := adminui.Origin{ID: o.ID, Addr: o.Addr, Protocol: o.Protocol, Subset: o.Subset, InFlight: o.InFlight}
			if o.EjectedUntil != nil {
				ov.EjectedUntil = *o.EjectedUntil
			}
			svc.Origins = append(svc.Origins, ov)
		}
		out.Services = append(out.Services, svc)
	}
	return out
}

func (s uiSource) Changed() <-chan struct{} {
	s.g.changedMu.Lock()
	defer s.g.changedMu.Unlock()
	return s.g.changed
}

func (s uiSource) Metrics(context.Context) ([]*dto.MetricFamily, error) { return s.g.m.reg.Gather() }

func (s uiSource) TokenRequired() bool { return s.g.cfg.AdminToken != "" }

// CheckToken compares in constant time, as adminAllowed does.
func (s uiSource) CheckToken(secret string) bool {
	want := s.g.cfg.AdminToken
	return want == "" || subtle.ConstantTimeCompare([]byte(secret), []byte(want)) == 1
}
