package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/server/ui"
)

// routeUI serves the web UI (server/ui) under /ui/ unless Config.UI is
// off.
func (s *Server) routeUI(mux *http.ServeMux) error {
	if !s.cfg.UI {
		return nil
	}
	u, err := ui.New(uiBackend{s: s.core, adm: s.adm, scrape: s.memberScraper()}, ui.Config{Logger: s.logger.With("component", "ui")})
	if err != nil {
		return err
	}
	u.Register(mux)
	return nil
}

// memberScraper is the HTTP client the Cluster page reads the other
// members' /metrics with: over TLS when the cluster uses it, presenting
// this member's peer certificate (members may require one on HTTP).
func (s *Server) memberScraper() *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute}
	if d := s.tls.dialConfig(); d != nil {
		c := d.Clone()
		c.NextProtos = []string{"http/1.1"}
		tr.TLSClientConfig = c
	}
	return &http.Client{Transport: tr}
}

// uiBackend lets the web UI reach this member.
type uiBackend struct {
	s      *core
	adm    *admission
	scrape *http.Client
}

var _ ui.Backend = uiBackend{}

func (b uiBackend) Self() (string, uint64) { return b.s.cfg.Name, b.s.raft.ID() }

func (b uiBackend) ACLEnabled() bool { return b.s.authz.resolver.Enabled() }

func (b uiBackend) Authorize(ctx context.Context, secret string) (*acl.Authorizer, error) {
	return consulBackend{s: b.s}.Authorize(ctx, secret)
}

func (b uiBackend) Raft() ui.RaftState {
	st := b.s.raft.Status()
	return ui.RaftState{State: strings.ToLower(strings.TrimPrefix(st.State.String(), "State")), Lead: st.Lead,
		Term: st.Term, Commit: st.Commit, Applied: b.s.raft.Applied()}
}

func (b uiBackend) Members() []*lodestonepb.Member { return b.s.store.Members() }

func (b uiBackend) LastHeard(id uint64) (time.Time, bool) { return b.s.raft.LastHeard(id) }

func (b uiBackend) LeaderChanged() <-chan struct{} { return b.s.raft.LeaderChanged() }

func (b uiBackend) Metrics(context.Context) ([]*dto.MetricFamily, error) {
	return b.s.metrics.reg.Gather()
}

func (b uiBackend) MemberMetrics(ctx context.Context, httpAddr string) ([]*dto.MetricFamily, error) {
	scheme := "http"
	if b.s.cfg.TLS.Enabled() {
		scheme = "https"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+httpAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := b.scrape.Do(req)
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		return nil, ue.Err // NB: "dial tcp ...: connection refused" says it; the URL is the member's
	}
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return nil, fmt.Errorf("%s/metrics answered %s: %s", httpAddr, resp.Status, strings.TrimSpace(string(msg)))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read %s/metrics: %w", httpAddr, err)
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		out = append(out, f)
	}
	return out, nil
}

func (b uiBackend) Admission() (*lodestonepb.AdmissionPolicy, float64) {
	p, _ := b.s.store.Admission()
	if !p.GetEnabled() {
		return nil, 1
	}
	return p, rampFraction(p, b.adm.started, time.Now())
}

func (b uiBackend) DataDir() string { return b.s.cfg.DataDir }

func (b uiBackend) Fresh(ctx context.Context) error { return b.s.leaderRead(ctx, time.Now()) }

func (b uiBackend) Store() ui.Reader { return b.s.store }

func (b uiBackend) Wait(ctx context.Context, d consulapi.Dep, after uint64, wait time.Duration) error {
	return consulapi.Block(ctx, b.s.hub, b.s.store, d, after, wait)
}

// Write applies the API's write rules, as consulapi's apply does: a
// refusal is checked again after catching up with the leader.
func (b uiBackend) Write(ctx context.Context, az *acl.Authorizer, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error) {
	catchUp := func(ctx context.Context) error { return b.s.leaderRead(ctx, time.Now()) }
	if err := acl.Recheck(ctx, catchUp, func() error { return acl.CheckCommand(az, b.s.store, cmd) }); err != nil {
		return nil, 0, err
	}
	return b.s.write(ctx, cmd)
}
