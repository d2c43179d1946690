package consulapi

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lodestone-kv/lodestone/acl"
)

// TestWriteErrorACL: a denial is 403 with Consul's text naming the missing
// permission; an unknown secret is 403 "ACL not found".
func TestWriteErrorACL(t *testing.T) {
	a := &API{logger: slog.New(slog.DiscardHandler)}
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
}
