package ui

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/internal/webui"
)

//go:embed templates
var templateFiles embed.FS

// Base is where the UI is mounted on the server's HTTP port.
const Base = "/ui/"

// freshTimeout bounds how long a page waits for the leader before it shows
// this member's own state instead.
const freshTimeout = 500 * time.Millisecond

// Config tunes the UI.
type Config struct {
	// Logger receives the UI's request errors; nil discards.
	Logger *slog.Logger
}

// UI is the web UI's handlers.
type UI struct {
	b        Backend
	logger   *slog.Logger
	sessions *webui.Sessions
	pages    map[string]*template.Template
	fleet    *fleet
	product  string
}

// New builds the UI over b.
func New(b Backend, cfg Config) (*UI, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	pages, err := webui.Parse(templateFiles, funcs(), pageFiles...)
	if err != nil {
		return nil, fmt.Errorf("ui templates: %w", err)
	}
	name, _ := b.Self()
	return &UI{b: b, logger: logger, sessions: webui.NewSessions("lodestone_ui", Base), pages: pages,
		fleet: newFleet(b), product: "Lodestone " + name}, nil
}

var pageFiles = []string{
	"templates/login.html", "templates/error.html", "templates/cluster.html", "templates/raftlog.html",
	"templates/watches.html", "templates/services.html", "templates/service.html", "templates/node.html",
	"templates/kv.html", "templates/kvedit.html", "templates/sessions.html",
}

var nav = []webui.Nav{
	{Name: "Cluster", URL: Base + "cluster"}, {Name: "Raft log", URL: Base + "raftlog"},
	{Name: "Watches", URL: Base + "watches"}, {Name: "Services", URL: Base + "services"},
	{Name: "KV", URL: Base + "kv"}, {Name: "Sessions", URL: Base + "sessions"},
}

// view is one page: the template that draws it, its navigation entry and
// how its data is built, for the page and for its event stream alike.
type view struct {
	file  string
	nav   string
	build func(ctx context.Context, r *http.Request, rc *request) (*built, error)
}

// request is what a page's builder knows of who asks.
type request struct {
	az    *acl.Authorizer
	fresh bool // the reads are as fresh as the API's default mode
}

// built is a page's data: what the templates draw, its title, and how its
// stream waits for the next change (nil: the page is not live).
type built struct {
	title string
	data  any
	wait  func(ctx context.Context) error
	flash []webui.Flash
	// streamQuery, if set, is the stream's query instead of the page's.
	streamQuery string
}

// pageError is a page that cannot be drawn: its status and why.
type pageError struct {
	code int
	msg  string
}

func (e *pageError) Error() string { return e.msg }

func notFound(format string, args ...any) error {
	return &pageError{http.StatusNotFound, fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) error {
	return &pageError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// Register adds the UI's routes to mux.
func (u *UI) Register(mux *http.ServeMux) {
	h := func(pattern string, f http.HandlerFunc) { mux.Handle(pattern, webui.Secure(f)) }
	mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", webui.Static()))
	h("GET /ui", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, Base+"cluster", http.StatusFound) })
	h("GET /ui/{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, Base+"cluster", http.StatusFound) })
	h("GET /ui/login", u.loginPage)
	h("POST /ui/login", u.login)
	h("POST /ui/logout", u.logout)
	for path, v := range map[string]view{
		"cluster":         {file: "templates/cluster.html", nav: "Cluster", build: u.cluster},
		"raftlog":         {file: "templates/raftlog.html", nav: "Raft log", build: u.raftlog},
		"watches":         {file: "templates/watches.html", nav: "Watches", build: u.watches},
		"services":        {file: "templates/services.html", nav: "Services", build: u.services},
		"services/{name}": {file: "templates/service.html", nav: "Services", build: u.service},
		"nodes/{node}":    {file: "templates/node.html", nav: "Services", build: u.node},
		"kv":              {file: "templates/kv.html", nav: "KV", build: u.kvList},
		"kv/edit":         {file: "templates/kvedit.html", nav: "KV", build: u.kvEdit},
		"sessions":        {file: "templates/sessions.html", nav: "Sessions", build: u.sessionsPage},
	} {
		h("GET "+Base+path, u.page(v, path))
		h("GET "+Base+"events/"+path, u.stream(v))
	}
	h("POST /ui/kv/put", u.kvPut)
	h("POST /ui/kv/delete", u.kvDelete)
	h("GET /ui/", func(w http.ResponseWriter, r *http.Request) {
		u.errorPage(w, r, "", &pageError{http.StatusNotFound, fmt.Sprintf("no page at %s; the pages are in the bar above", r.URL.Path)})
	})
}

// authorize resolves the browser's login. Without ACLs everyone may read
// everything. With ACLs, a browser without a valid token goes to the login
// page (login false).
func (u *UI) authorize(w http.ResponseWriter, r *http.Request) (az *acl.Authorizer, who string, ok bool) {
	if !u.b.ACLEnabled() {
		az, err := u.b.Authorize(r.Context(), "")
		if err != nil {
			u.errorPage(w, r, "", &pageError{http.StatusServiceUnavailable, "cannot authorize: " + err.Error()})
			return nil, "", false
		}
		return az, "", true
	}
	secret := u.sessions.Token(r)
	if secret == "" {
		u.toLogin(w, r, "")
		return nil, "", false
	}
	az, err := u.b.Authorize(r.Context(), secret)
	switch {
	case errors.Is(err, acl.ErrNotFound):
		u.sessions.ClearToken(w, r)
		u.toLogin(w, r, "gone")
		return nil, "", false
	case err != nil:
		u.errorPage(w, r, "", &pageError{http.StatusServiceUnavailable, "cannot check your token now (" + err.Error() + "); try again"})
		return nil, "", false
	}
	return az, "token " + webui.Truncate(8, az.AccessorID()), true
}

func (u *UI) toLogin(w http.ResponseWriter, r *http.Request, why string) {
	q := url.Values{"next": {r.URL.RequestURI()}}
	if why != "" {
		q.Set("why", why)
	}
	http.Redirect(w, r, Base+"login?"+q.Encode(), http.StatusSeeOther)
}

// page serves a view's whole page.
func (u *UI) page(v view, path string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		az, who, ok := u.authorize(w, r)
		if !ok {
			return
		}
		ctx := r.Context()
		rc := &request{az: az}
		fctx, cancel := context.WithTimeout(ctx, freshTimeout)
		err := u.b.Fresh(fctx)
		cancel()
		rc.fresh = err == nil
		b, err := v.build(ctx, r, rc)
		if err != nil {
			u.errorPage(w, r, who, err)
			return
		}
		if !rc.fresh {
			b.flash = append(b.flash, webui.Flash{Class: "warn", Text: fmt.Sprintf(
				"No leader answered within %v: this page shows member %s's own state at index %d, which may be behind the cluster.",
				freshTimeout, u.product, u.b.Store().Index())})
		}
		p := u.layout(w, r, who, v.nav, b)
		if b.wait != nil {
			p.Stream = Base + "events/" + strings.TrimPrefix(r.URL.Path, Base)
			if q := cmp.Or(b.streamQuery, r.URL.RawQuery); q != "" {
				p.Stream += "?" + q
			}
		}
		u.render(w, v.file, "layout", http.StatusOK, p)
	}
}

func (u *UI) layout(w http.ResponseWriter, r *http.Request, who, active string, b *built) webui.Page {
	sid := u.sessions.Session(w, r)
	return webui.Page{Product: u.product, Title: b.title, Base: Base, Nav: nav, Active: active, Who: who,
		CSRF: u.sessions.CSRF(sid), Flash: b.flash, Data: b.data}
}

// stream serves a view's live region as an event stream.
func (u *UI) stream(v view) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var az *acl.Authorizer
		var authErr error
		if u.b.ACLEnabled() {
			az, authErr = u.b.Authorize(r.Context(), u.sessions.Token(r))
			if u.sessions.Token(r) == "" || errors.Is(authErr, acl.ErrNotFound) {
				authErr = errors.New("logged out: reload the page to log in")
			}
		} else {
			az, authErr = u.b.Authorize(r.Context(), "")
		}
		var wait func(context.Context) error
		webui.Stream(w, r, webui.Live{
			Render: func(ctx context.Context) (string, error) {
				if authErr != nil {
					return "", authErr
				}
				b, err := v.build(ctx, r, &request{az: az, fresh: true})
				if err != nil {
					return "", err
				}
				wait = b.wait
				var buf bytes.Buffer
				if err := u.pages[v.file].ExecuteTemplate(&buf, "live", b.data); err != nil {
					return "", err
				}
				return buf.String(), nil
			},
			Wait: func(ctx context.Context) error {
				if wait == nil {
					<-ctx.Done()
					return ctx.Err()
				}
				return wait(ctx)
			},
		})
	}
}

func (u *UI) render(w http.ResponseWriter, file, tmpl string, code int, data any) {
	var buf bytes.Buffer
	if err := u.pages[file].ExecuteTemplate(&buf, tmpl, data); err != nil {
		u.logger.Error("ui: render page", "page", file, "err", err)
		http.Error(w, "the page could not be drawn: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

// errorPage answers a page that cannot be drawn with its reason.
func (u *UI) errorPage(w http.ResponseWriter, r *http.Request, who string, err error) {
	code, msg := http.StatusInternalServerError, err.Error()
	var pe *pageError
	var de *acl.DeniedError
	switch {
	case errors.As(err, &pe):
		code = pe.code
	case errors.As(err, &de):
		code = http.StatusForbidden
	}
	if code >= 500 {
		u.logger.Warn("ui: page failed", "path", r.URL.Path, "err", err)
	}
	b := &built{title: http.StatusText(code), flash: []webui.Flash{{Class: "bad", Text: msg}}}
	u.render(w, "templates/error.html", "layout", code, u.layout(w, r, who, "", b))
}

// loginPage asks for a token when ACLs are on.
func (u *UI) loginPage(w http.ResponseWriter, r *http.Request) {
	b := &built{title: "Log in", data: loginData{Next: safeNext(r.URL.Query().Get("next")), ACL: u.b.ACLEnabled()}}
	if r.URL.Query().Get("why") == "gone" {
		b.flash = append(b.flash, webui.Flash{Class: "warn", Text: "The token you logged in with no longer exists; log in with another."})
	}
	u.render(w, "templates/login.html", "layout", http.StatusOK, u.layout(w, r, "", "", b))
}

type loginData struct {
	Next string
	ACL  bool
}

// login checks the token's secret and keeps it in the browser.
func (u *UI) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.PostFormValue("next"))
	fail := func(code int, msg string) {
		b := &built{title: "Log in", data: loginData{Next: next, ACL: u.b.ACLEnabled()}, flash: []webui.Flash{{Class: "bad", Text: msg}}}
		u.render(w, "templates/login.html", "layout", code, u.layout(w, r, "", "", b))
	}
	if err := u.sessions.CheckCSRF(r); err != nil {
		fail(http.StatusForbidden, err.Error())
		return
	}
	secret := strings.TrimSpace(r.PostFormValue("token"))
	if secret == "" {
		fail(http.StatusBadRequest, "Give the secret of an ACL token (the SecretID that `lodestone acl token create` printed).")
		return
	}
	if _, err := u.b.Authorize(r.Context(), secret); err != nil {
		if errors.Is(err, acl.ErrNotFound) {
			fail(http.StatusForbidden, "ACL not found: no token has this secret.")
			return
		}
		fail(http.StatusServiceUnavailable, "cannot check the token now: "+err.Error())
		return
	}
	u.sessions.SetToken(w, r, secret)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (u *UI) logout(w http.ResponseWriter, r *http.Request) {
	if err := u.sessions.CheckCSRF(r); err != nil {
		u.errorPage(w, r, "", &pageError{http.StatusForbidden, err.Error()})
		return
	}
	u.sessions.ClearToken(w, r)
	http.Redirect(w, r, Base+"login", http.StatusSeeOther)
}

// safeNext keeps a post-login redirect inside the UI.
func safeNext(next string) string {
	if !strings.HasPrefix(next, Base) || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return Base + "cluster"
	}
	return next
}
