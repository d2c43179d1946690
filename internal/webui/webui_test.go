package webui

import (
	"bufio"
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestCSRFIsBoundToTheSession(t *testing.T) {
	s := NewSessions("t", "/ui/")
	rec := httptest.NewRecorder()
	sid := s.Session(rec, httptest.NewRequest("GET", "/ui/", nil))
	cookies := rec.Result().Cookies()
	if len(cookies) != 1 || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode || cookies[0].Path != "/ui/" {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path /ui/", cookies)
	}
	post := func(csrf string, withCookie bool) error {
		r := httptest.NewRequest("POST", "/ui/kv", strings.NewReader(url.Values{"csrf": {csrf}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if withCookie {
			r.AddCookie(cookies[0])
		}
		return s.CheckCSRF(r)
	}
	if err := post(s.CSRF(sid), true); err != nil {
		t.Fatalf("the session's own token refused: %v", err)
	}
	if err := post(s.CSRF(sid), false); !errors.Is(err, ErrCSRF) {
		t.Fatalf("a token without its session cookie: %v, want ErrCSRF", err)
	}
	if err := post(s.CSRF("another-session-id-00000000000000"), true); !errors.Is(err, ErrCSRF) {
		t.Fatalf("another session's token: %v, want ErrCSRF", err)
	}
	if err := post(NewSessions("t", "/ui/").CSRF(sid), true); !errors.Is(err, ErrCSRF) {
		t.Fatalf("a token made under another process's key: %v, want ErrCSRF", err)
	}
}

func TestSecureHeaders(t *testing.T) {
	rec := httptest.NewRecorder()
	Secure(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	h := rec.Header()
	if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Fatalf("CSP %q", csp)
	}
	if h.Get("X-Frame-Options") != "DENY" || h.Get("Cache-Control") != "no-store" {
		t.Fatalf("headers %v", h)
	}
}

func TestStreamSendsOnlyChanges(t *testing.T) {
	versions := make(chan string, 4)
	for _, v := range []string{"a", "a", "b\nc"} {
		versions <- v
	}
	cur := <-versions
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Stream(w, r, Live{
			Render: func(context.Context) (string, error) {
				if cur == "gone" {
					return "", errors.New("token revoked")
				}
				return cur, nil
			},
			Wait: func(ctx context.Context) error {
				select {
				case cur = <-versions:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			},
		})
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	var got []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "event: ") || strings.HasPrefix(line, "data: ") {
			got = append(got, line)
		}
		if line == "data: c" {
			versions <- "gone"
		}
		if line == "event: stop" {
			sc.Scan()
			got = append(got, sc.Text())
			break
		}
	}
	want := []string{"event: html", "data: a", "event: html", "data: b", "data: c", "event: stop", "data: token revoked"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("events %q\nwant %q (the repeated \"a\" must not be sent again)", got, want)
	}
}

func TestFormats(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Bytes(512), "512 B"}, {Bytes(3.9 * (1 << 30)), "3.9 GiB"}, {Bytes(math.NaN()), "–"},
		{Num(1234567), "1,234,567"}, {Num(-1000), "-1,000"}, {Num(0.25), "0.25"},
		{Seconds(0.00085), "850 µs"}, {Seconds(0.0124), "12.4 ms"}, {Seconds(2.1), "2.10 s"}, {Seconds(math.NaN()), "–"},
		{Percent(0.87), "87%"}, {Ago(4200 * time.Millisecond), "4.2s"}, {Truncate(3, "abcdef"), "abc…"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
