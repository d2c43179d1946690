package server

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// The native Catalog service: a blocking HealthService read (a catalog
// watch through the hub) sleeps through writes to other services and
// wakes for its own; Session create/renew/destroy with rejections as
// FailedPrecondition.
func TestCatalogGRPCBlockingHealthAndSessions(t *testing.T) {
	c := newTestCluster(t, 3)
	f := c.follower()
	cat := lodestonepb.NewCatalogClient(c.conn(f))
	reg := func(node, svc string, st lodestonepb.HealthStatus) {
		t.Helper()
		err := retryUnavailable(t, func(ctx context.Context) error {
			_, err := cat.Register(ctx, &lodestonepb.CatalogRegisterRequest{
				Node:    &lodestonepb.Node{Name: node, Address: "10.1.0.1"},
				Service: &lodestonepb.Service{Name: svc},
				Checks:  []*lodestonepb.Check{{CheckId: svc + "-ok", ServiceId: svc, Status: st}},
			})
			return err
		})
		if err != nil {
			t.Fatalf("register %s/%s: %v", node, svc, err)
		}
	}
	reg("a", "api", lodestonepb.HealthStatus_HEALTH_PASSING)
	first, err := cat.HealthService(ctxT(t), &lodestonepb.HealthServiceRequest{Name: "api", PassingOnly: true})
	if err != nil || len(first.Instances) != 1 {
		t.Fatalf("health api: %v %v", first, err)
	}
	idx := first.Header.Index

	start := time.Now()
	reg("b", "other", lodestonepb.HealthStatus_HEALTH_PASSING)
	idle, err := cat.HealthService(ctxT(t), &lodestonepb.HealthServiceRequest{Name: "api", PassingOnly: true, WaitIndex: idx, WaitMs: 300})
	if err != nil || idle.Header.Index != idx || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("an unrelated write woke the watch: %v %v after %v", idle.GetHeader(), err, time.Since(start))
	}

	woke := make(chan *lodestonepb.HealthServiceResponse, 1)
	go func() {
		r, err := cat.HealthService(ctxT(t), &lodestonepb.HealthServiceRequest{Name: "api", PassingOnly: true, WaitIndex: idx, WaitMs: 20000})
		if err != nil {
			t.Errorf("blocking health: %v", err)
		}
		woke <- r
	}()
	reg("a", "api", lodestonepb.HealthStatus_HEALTH_CRITICAL)
	select {
	case r := <-woke:
		if r == nil || r.Header.Index <= idx || len(r.Instances) != 0 {
			t.Fatalf("woke with %v, want no passing instance above index %d", r, idx)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("blocking HealthService did not wake on its service's change")
	}

	sess := lodestonepb.NewSessionClient(c.conn(f))
	if _, err := sess.Create(ctxT(t), &lodestonepb.CreateSessionRequest{Session: &lodestonepb.SessionEntry{Node: "ghost"}}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("session on an unregistered node: %v, want FailedPrecondition", err)
	}
	if _, err := sess.Create(ctxT(t), &lodestonepb.CreateSessionRequest{Session: &lodestonepb.SessionEntry{Node: "a", Checks: []string{"api-ok"}}}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("session bound to a critical check: %v, want FailedPrecondition", err)
	}
	created, err := sess.Create(ctxT(t), &lodestonepb.CreateSessionRequest{Session: &lodestonepb.SessionEntry{Node: "b", Name: "s"}})
	if err != nil || len(created.Session.Id) != 36 {
		t.Fatalf("create: %v %v", created, err)
	}
	if _, err := sess.Renew(ctxT(t), &lodestonepb.RenewSessionRequest{Id: created.Session.Id}); err != nil {
		t.Fatal(err)
	}
	if got := gauge(t, c.servers[f], "lodestone_sessions_active"); got != 1 {
		t.Fatalf("sessions_active on %s = %v, want 1", f, got)
	}
	d, err := sess.Destroy(ctxT(t), &lodestonepb.DestroySessionRequest{Id: created.Session.Id})
	if err != nil || !d.Destroyed {
		t.Fatalf("destroy: %v %v", d, err)
	}
	if _, err := sess.Renew(ctxT(t), &lodestonepb.RenewSessionRequest{Id: created.Session.Id}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("renew a destroyed session: %v, want FailedPrecondition", err)
	}
}

// gauge reads a metric from a server's registry, summed over its labels: a
// gauge's or counter's value, a histogram's count of observations.
func gauge(t *testing.T, s *Server, name string) float64 {
	t.Helper()
	return gathered(t, s.Registry(), name)
}

// gathered reads a metric from g as gauge does.
func gathered(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mf := family(t, g, name)
	if mf == nil {
		t.Fatalf("metric %s not found", name)
	}
	var sum float64
	for _, m := range mf.GetMetric() {
		sum += metricValue(m)
	}
	return sum
}

// family is the metric family name in g, or nil.
func family(t *testing.T, g prometheus.Gatherer, name string) *dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}
