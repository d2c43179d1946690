// Package webui is what the server's and the gateway's web UIs share: the
// page layout, the stylesheet and the one small script (embedded, served
// from the binary), the security headers, the login cookie and the CSRF
// token of the forms that write, the server-sent event stream that keeps a
// page's live region current, and the template functions the pages format
// numbers with. It knows nothing of what the pages show.
//
// Security model: every page is served with a Content-Security-Policy that
// allows scripts and styles from the UI's own origin only (no inline
// script or style, so an injected string cannot run), X-Frame-Options DENY
// and no caching. A login stores the token in an HttpOnly, SameSite=Strict
// cookie (Secure over TLS). A form that writes carries a CSRF token bound
// to the browser's session cookie by an HMAC under a key made at start,
// and is refused without it: SameSite=Strict already keeps other sites'
// requests from carrying the cookies, the token is the second lock.
package webui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"html/template"
	"io/fs"
	"net/http"
	"time"
)

//go:embed static templates
var files embed.FS

// Static serves the stylesheet and the script under the path it is
// mounted at with http.StripPrefix.
func Static() http.Handler {
	sub, _ := fs.Sub(files, "static")
	fsrv := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=300")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fsrv.ServeHTTP(w, r)
	})
}

// CSP is the pages' Content-Security-Policy: the UI's own script and
// stylesheet, inline SVG, its own event streams and forms; nothing inline,
// nothing framed.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Secure sets the security headers on every response of next.
func Secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if h.Get("Cache-Control") == "" {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

// Sessions issues a browser its session cookie, binds CSRF tokens to it
// and keeps its login token. Cookies are named after Prefix, so UIs on
// other ports of the same host (cookies ignore ports) keep theirs apart.
type Sessions struct {
	prefix string
	path   string
	key    []byte
}

// NewSessions returns Sessions whose cookies are named prefix_sid and
// prefix_token and sent only under path. Its CSRF key is new: tokens of
// an earlier process are refused, and the page that carried one reloads.
func NewSessions(prefix, path string) *Sessions {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		panic("webui: no randomness for the CSRF key: " + err.Error())
	}
	return &Sessions{prefix: prefix, path: path, key: key}
}

func (s *Sessions) cookie(r *http.Request, name, value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: s.prefix + "_" + name, Value: value, Path: s.path, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil}
}

// Session returns the browser's session id, issuing one (a cookie on w)
// when it has none.
func (s *Sessions) Session(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(s.prefix + "_sid"); err == nil && len(c.Value) == 32 {
		return c.Value
	}
	b := make([]byte, 16)
	rand.Read(b)
	sid := hex.EncodeToString(b)
	http.SetCookie(w, s.cookie(r, "sid", sid, 0))
	return sid
}

// CSRF is the token a form of session sid carries.
func (s *Sessions) CSRF(sid string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(sid))
	return hex.EncodeToString(m.Sum(nil))
}

// ErrCSRF refuses a form without the token of its session.
var ErrCSRF = errors.New("this form is out of date or did not come from this page (missing or wrong CSRF token); reload the page and send it again")

// CheckCSRF checks a POSTed form's csrf field against the session cookie.
func (s *Sessions) CheckCSRF(r *http.Request) error {
	c, err := r.Cookie(s.prefix + "_sid")
	if err != nil || c.Value == "" {
		return ErrCSRF
	}
	got := r.PostFormValue("csrf")
	if subtle.ConstantTimeCompare([]byte(got), []byte(s.CSRF(c.Value))) != 1 {
		return ErrCSRF
	}
	return nil
}

// Token is the login token the browser holds, or "".
func (s *Sessions) Token(r *http.Request) string {
	if c, err := r.Cookie(s.prefix + "_token"); err == nil {
		return c.Value
	}
	return ""
}

// SetToken stores a login token in the browser for the session's life.
func (s *Sessions) SetToken(w http.ResponseWriter, r *http.Request, token string) {
	http.SetCookie(w, s.cookie(r, "token", token, 0))
}

// ClearToken logs the browser out.
func (s *Sessions) ClearToken(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, s.cookie(r, "token", "", -1))
}

// Nav is one link of a UI's navigation bar.
type Nav struct{ Name, URL string }

// Flash is a banner above a page's content: Class is ok, warn or bad.
type Flash struct{ Class, Text string }

// Page is what the layout renders around a page's content.
type Page struct {
	Product string // the header's brand: "Lodestone n1"
	Title   string
	Base    string // the UI's root path, with a trailing slash
	Nav     []Nav
	Active  string // the Nav entry to highlight
	Who     string // who is logged in; "" shows no logout
	CSRF    string
	Stream  string // the live region's event stream, if any
	Flash   []Flash
	Data    any // the page's own
}

// Parse builds one template set per page: the layout and the page's file
// from pages (which defines "content" and, for a live page, "live").
// Names are file names.
func Parse(pages fs.FS, funcs template.FuncMap, names ...string) (map[string]*template.Template, error) {
	base, err := template.New("layout").Funcs(Funcs()).Funcs(funcs).ParseFS(files, "templates/layout.html")
	if err != nil {
		return nil, err
	}
	out := make(map[string]*template.Template, len(names))
	for _, n := range names {
		t, err := template.Must(base.Clone()).ParseFS(pages, n)
		if err != nil {
			return nil, err
		}
		out[n] = t
	}
	return out, nil
}

// now is the clock the template functions read (tests).
var now = time.Now
