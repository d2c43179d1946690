package token

import (
	"context"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc/metadata"
)

func TestFromRequestOrder(t *testing.T) {
	for _, c := range []struct {
		name             string
		header, auth, qs string
		want             string
	}{
		{"header wins", "h", "Bearer b", "?token=q", "h"},
		{"bearer next", "", "Bearer b", "?token=q", "b"},
		{"bearer any case", "", "bearer  b ", "", "b"},
		{"basic is not a token", "", "Basic dXNlcjpwYXNz", "?token=q", "q"},
		{"query last", "", "", "?token=q", "q"},
		{"none is anonymous", "", "", "", ""},
		{"other params are anonymous", "", "", "?recurse&dc=dc1", ""},
		{"escaped name", "", "", "?t%6Fken=e", "e"},
		{"among others", "", "", "?stale&token=q&index=3", "q"},
	} {
		r := httptest.NewRequest("GET", "/v1/kv/x"+c.qs, nil)
		if c.header != "" {
			r.Header.Set(Header, c.header)
		}
		if c.auth != "" {
			r.Header.Set("Authorization", c.auth)
		}
		if got := FromRequest(r); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

func TestPerRPCRoundTrip(t *testing.T) {
	md, err := PerRPC("s3cret").GetRequestMetadata(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.New(md))
	if got := FromContext(ctx); got != "s3cret" {
		t.Fatalf("FromContext after PerRPC = %q", got)
	}
	ctx = metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer b"))
	if got := FromContext(ctx); got != "b" {
		t.Fatalf("bearer metadata = %q", got)
	}
	if got := FromContext(context.Background()); got != "" {
		t.Fatalf("no metadata = %q", got)
	}
}

func TestFromContextOrder(t *testing.T) {
	for _, c := range []struct {
		name string
		md   metadata.MD
		want string
	}{
		{"token wins", metadata.Pairs("x-consul-token", "h", "authorization", "Bearer b"), "h"},
		{"empty token falls to bearer", metadata.Pairs("x-consul-token", "", "authorization", "Bearer b"), "b"},
		{"first bearer of several", metadata.Pairs("authorization", "Basic dXNlcjpwYXNz", "authorization", "bearer  b "), "b"},
		{"key of any case", metadata.MD{"X-Consul-Token": {"h"}}, "h"},
		{"basic is not a token", metadata.Pairs("authorization", "Basic dXNlcjpwYXNz"), ""},
		{"none is anonymous", metadata.Pairs("user-agent", "x"), ""},
	} {
		ctx := metadata.NewIncomingContext(context.Background(), c.md)
		if got := FromContext(ctx); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

// BenchmarkFromContext is the token lookup every gRPC call makes with ACLs
// on, with the headers grpc-go puts in a unary call's metadata.
func BenchmarkFromContext(b *testing.B) {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(
		":authority", "127.0.0.1:8502", "content-type", "application/grpc", "user-agent", "grpc-go/1.85.0",
		"x-consul-token", "8f1e4c2a-5b6d-4e7f-9a0b-1c2d3e4f5a6b"))
	b.ReportAllocs()
	for b.Loop() {
		if FromContext(ctx) == "" {
			b.Fatal("no token")
		}
	}
}
