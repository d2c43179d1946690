package consulapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/acl"
)

// TestWriteErrorACL: a denial is 403 with Consul's text naming the missing
// permission; an unknown secret is 403 "ACL not found". Each is counted.
func TestWriteErrorACL(t *testing.T) {
	denied := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "denied"}, []string{"api", "reason"})
	a := New(nil, Config{Denied: denied})
	for _, c := range []struct {
		err  error
		want string
	}{
		{acl.DenyAll("abc").Check(acl.ResourceACL, "", acl.AccessWrite), "Permission denied: token with AccessorID 'abc' lacks permission 'acl:write'"},
		{acl.ErrNotFound, "ACL not found"},
	} {
		w := httptest.NewRecorder()
		a.writeError(w, httptest.NewRequest(http.MethodGet, "/v1/acl/tokens", nil), c.err)
		if w.Code != http.StatusForbidden || strings.TrimSpace(w.Body.String()) != c.want {
			t.Errorf("%v: %d %q, want 403 %q", c.err, w.Code, w.Body.String(), c.want)
		}
	}
	for _, reason := range []string{"permission", "token"} {
		if got := testutil.ToFloat64(denied.WithLabelValues("http", reason)); got != 1 {
			t.Errorf("denials counted for %s: %v, want 1", reason, got)
		}
	}
}

// TestWriteErrorCutShort: a request cut short (a server shutting down, a
// deadline), however the error reaches the API, is a 503 a client retries
// elsewhere, not a 500.
func TestWriteErrorCutShort(t *testing.T) {
	a := New(nil, Config{})
	for _, err := range []error{context.Canceled, context.DeadlineExceeded,
		status.Error(codes.Canceled, "context canceled"), status.Error(codes.DeadlineExceeded, "context deadline exceeded")} {
		w := httptest.NewRecorder()
		a.writeError(w, httptest.NewRequest(http.MethodPut, "/v1/kv/k", nil), err)
		if w.Code != http.StatusServiceUnavailable {
			t.Errorf("%v: %d %q, want 503", err, w.Code, w.Body.String())
		}
	}
}
