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
