package adminui

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"html/template"
	"log/slog"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lodestone-kv/lodestone/internal/promwin"
	"github.com/lodestone-kv/lodestone/internal/svgchart"
	"github.com/lodestone-kv/lodestone/internal/webui"
)

//go:embed templates
var templateFiles embed.FS

// Base is where the UI is mounted on the admin port.
const Base = "/ui/"

// Source is what the UI reads of a gateway.
type Source interface {
	// Snapshot is the routing table and the registry link now.
	Snapshot() Snapshot
	// Changed returns a channel closed at the next table update or change
	// of the registry link.
	Changed() <-chan struct{}
	// Metrics gathers the gateway's registry.
	Metrics(ctx context.Context) ([]*dto.MetricFamily, error)
	// TokenRequired reports whether the admin endpoints need a token, and
	// CheckToken whether secret is it.
	TokenRequired() bool
	CheckToken(secret string) bool
}

// Snapshot is the gateway's state as the UI shows it.
type Snapshot struct {
	Index       uint64
	Connected   bool
	Ready       bool
	Staleness   time.Duration
	Shards      int
	InFlight    int64
	MaxInFlight int
	Routes      []Route
	Services    []Service
}

// Route is one route and where it came from ("file" or "registry").
type Route struct {
	Name, Host, PathPrefix, Service, From string
	StripPrefix                           bool
}

// Service is one service's ring: subsets, and the shards sharing each.
type Service struct {
	Name        string
	Subsets     int
	Replication int
	Origins     []Origin
}

// Origin is one instance of a service.
type Origin struct {
	ID, Addr, Protocol string
	Subset             int
	InFlight           int64
	EjectedUntil       time.Time // zero: not ejected
}

// Metric names the page reads.
const (
	mOriginLatency  = "gateway_origin_request_duration_seconds"
	mOriginRequests = "gateway_origin_requests_total"
	mRouteRequests  = "gateway_requests_total"
	mRouteLatency   = "gateway_request_duration_seconds"
	mRouteRetries   = "gateway_retries_total"
	mShed           = "gateway_shed_requests_total"
	mBudget         = "gateway_retry_budget_exhausted_total"
	mEjections      = "gateway_ejections_total"
	mConnsOpen      = "gateway_origin_connections_open"
	mConnsOpened    = "gateway_origin_connections_opened_total"
	mUpdates        = "gateway_table_updates_total"
	mUnrouted       = "gateway_unrouted_requests_total"
	mStaleness      = "gateway_table_staleness_seconds"
)

// MetricNames lists every metric the page reads.
var MetricNames = []string{mOriginLatency, mOriginRequests, mRouteRequests, mRouteLatency, mRouteRetries, mShed,
	mBudget, mEjections, mConnsOpen, mConnsOpened, mUpdates, mUnrouted, mStaleness}

// UI is the gateway UI's handlers.
type UI struct {
	src      Source
	logger   *slog.Logger
	sessions *webui.Sessions
	pages    map[string]*template.Template
	sampler  *promwin.Sampler
}

// New builds the UI over src.
func New(src Source, logger *slog.Logger) (*UI, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	pages, err := webui.Parse(templateFiles, nil, "templates/gateway.html", "templates/login.html")
	if err != nil {
		return nil, fmt.Errorf("gateway ui templates: %w", err)
	}
	return &UI{src: src, logger: logger, sessions: webui.NewSessions("lodestone_gateway_ui", Base), pages: pages,
		sampler: promwin.New(src.Metrics, promwin.Config{Filter: func(n string) bool { return strings.HasPrefix(n, "gateway_") }})}, nil
}

// Register adds the UI's routes to mux.
func (u *UI) Register(mux *http.ServeMux) {
	h := func(pattern string, f http.HandlerFunc) { mux.Handle(pattern, webui.Secure(f)) }
	mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", webui.Static()))
	h("GET /ui", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, Base, http.StatusFound) })
	h("GET /ui/{$}", u.page)
	h("GET /ui/events", u.stream)
	h("GET /ui/login", func(w http.ResponseWriter, r *http.Request) { u.login(w, r, "") })
	h("POST /ui/login", u.loginPost)
	h("POST /ui/logout", u.logout)
}

var nav = []webui.Nav{{Name: "Gateway", URL: Base}}

func (u *UI) allowed(r *http.Request) bool {
	return !u.src.TokenRequired() || u.src.CheckToken(u.sessions.Token(r))
}

func (u *UI) page(w http.ResponseWriter, r *http.Request) {
	if !u.allowed(r) {
		http.Redirect(w, r, Base+"login", http.StatusSeeOther)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	d := u.build(ctx)
	who := ""
	if u.src.TokenRequired() {
		who = "admin"
	}
	p := u.layout(w, r, "Gateway", who)
	p.Stream, p.Data = Base+"events", d
	u.render(w, "templates/gateway.html", http.StatusOK, p)
}

func (u *UI) layout(w http.ResponseWriter, r *http.Request, title, who string) webui.Page {
	return webui.Page{Product: "Lodestone gateway", Title: title, Base: Base, Nav: nav, Active: "Gateway", Who: who,
		CSRF: u.sessions.CSRF(u.sessions.Session(w, r))}
}

func (u *UI) render(w http.ResponseWriter, file string, code int, p webui.Page) {
	var buf bytes.Buffer
	if err := u.pages[file].ExecuteTemplate(&buf, "layout", p); err != nil {
		u.logger.Error("gateway ui: render", "err", err)
		http.Error(w, "the page could not be drawn: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

func (u *UI) stream(w http.ResponseWriter, r *http.Request) {
	ok := u.allowed(r)
	webui.Stream(w, r, webui.Live{
		Render: func(ctx context.Context) (string, error) {
			if !ok {
				return "", fmt.Errorf("logged out: reload the page to give the admin token")
			}
			var buf bytes.Buffer
			err := u.pages["templates/gateway.html"].ExecuteTemplate(&buf, "live", u.build(ctx))
			return buf.String(), err
		},
		Wait: func(ctx context.Context) error {
			t := time.NewTimer(time.Second)
			defer t.Stop()
			select {
			case <-u.src.Changed():
			case <-t.C:
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		},
	})
}

func (u *UI) login(w http.ResponseWriter, r *http.Request, failure string) {
	p := u.layout(w, r, "Admin token", "")
	code := http.StatusOK
	if failure != "" {
		p.Flash, code = []webui.Flash{{Class: "bad", Text: failure}}, http.StatusForbidden
	}
	p.Data = u.src.TokenRequired()
	u.render(w, "templates/login.html", code, p)
}

func (u *UI) loginPost(w http.ResponseWriter, r *http.Request) {
	if err := u.sessions.CheckCSRF(r); err != nil {
		u.login(w, r, err.Error())
		return
	}
	secret := strings.TrimSpace(r.PostFormValue("token"))
	if !u.src.CheckToken(secret) {
		u.login(w, r, "That is not the gateway's admin token (the contents of its --admin-token-file).")
		return
	}
	u.sessions.SetToken(w, r, secret)
	http.Redirect(w, r, Base, http.StatusSeeOther)
}

func (u *UI) logout(w http.ResponseWriter, r *http.Request) {
	if err := u.sessions.CheckCSRF(r); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	u.sessions.ClearToken(w, r)
	http.Redirect(w, r, Base+"login", http.StatusSeeOther)
}

// data is what the page draws.
type data struct {
	Now         time.Time
	S           Snapshot
	Stale       string
	Updates     float64
	Shed        []svgchart.Bar
	ShedTotal   float64
	Budget      float64
	BudgetWin   float64
	Unrouted    float64
	Routes      []routeRow
	Services    []serviceRow
	InFlightMax int
}

type routeRow struct {
	Route
	Rate, ErrRate, P99, Retries float64
}

type serviceRow struct {
	Service
	ConnsOpen, ConnsOpened, Ejections float64
	Ejected                           int
	Origins                           []originRow
}

type originRow struct {
	Origin
	Ejected        bool
	EjectedFor     string
	Rate, P50, P99 float64
	Errors         float64
}

func (u *UI) build(ctx context.Context) *data {
	s := u.src.Snapshot()
	sm, _ := u.sampler.Refresh(ctx)
	w, ok := u.sampler.Window(time.Minute)
	if !ok || sm == nil {
		w = promwin.Window{From: sm, To: sm}
	}
	now := time.Now()
	d := &data{Now: now, S: s, Stale: webui.Ago(s.Staleness)}
	if sm != nil {
		d.Updates = w.Rate(mUpdates)
		for _, reason := range sm.LabelValues(mShed, "reason") {
			v := sm.Value(mShed, "reason", reason)
			d.ShedTotal += v
			class := "ok"
			if w.Increase(mShed, "reason", reason) > 0 {
				class = "bad"
			}
			d.Shed = append(d.Shed, svgchart.Bar{Label: reason, Value: v, Class: class})
		}
		d.Budget, d.BudgetWin, d.Unrouted = sm.Value(mBudget), w.Increase(mBudget), sm.Value(mUnrouted)
	}
	for _, r := range s.Routes {
		row := routeRow{Route: r, Rate: math.NaN(), ErrRate: math.NaN(), P99: math.NaN(), Retries: math.NaN()}
		if sm != nil {
			row.Rate = w.Rate(mRouteRequests, "route", r.Name)
			row.ErrRate = w.Rate(mRouteRequests, "route", r.Name, "class", "5xx") + nanZero(w.Rate(mRouteRequests, "route", r.Name, "class", "error"))
			row.P99 = w.Quantile(0.99, mRouteLatency, "route", r.Name)
			row.Retries = w.Increase(mRouteRetries, "route", r.Name)
		}
		d.Routes = append(d.Routes, row)
	}
	sort.Slice(s.Services, func(i, j int) bool { return s.Services[i].Name < s.Services[j].Name })
	for _, svc := range s.Services {
		row := serviceRow{Service: svc}
		if sm != nil {
			row.ConnsOpen, row.ConnsOpened, row.Ejections = sm.Value(mConnsOpen, "service", svc.Name), sm.Value(mConnsOpened, "service", svc.Name), sm.Value(mEjections, "service", svc.Name)
		}
		for _, o := range svc.Origins {
			or := originRow{Origin: o, Rate: math.NaN(), P50: math.NaN(), P99: math.NaN(), Errors: math.NaN()}
			if !o.EjectedUntil.IsZero() && o.EjectedUntil.After(now) {
				or.Ejected, or.EjectedFor = true, webui.Ago(o.EjectedUntil.Sub(now))
				row.Ejected++
			}
			if sm != nil {
				or.Rate = w.Rate(mOriginRequests, "service", svc.Name, "origin", o.ID)
				or.P50 = w.Quantile(0.5, mOriginLatency, "service", svc.Name, "origin", o.ID)
				or.P99 = w.Quantile(0.99, mOriginLatency, "service", svc.Name, "origin", o.ID)
				or.Errors = nanZero(w.Increase(mOriginRequests, "service", svc.Name, "origin", o.ID, "class", "5xx")) +
					nanZero(w.Increase(mOriginRequests, "service", svc.Name, "origin", o.ID, "class", "error"))
			}
			row.Origins = append(row.Origins, or)
		}
		d.Services = append(d.Services, row)
	}
	return d
}

func nanZero(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}
