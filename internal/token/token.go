// Package token is how an ACL token travels: where a server finds it on an
// HTTP request or a gRPC call, and how a client attaches it to every call.
//
// HTTP, as Consul: the X-Consul-Token header, then an Authorization header
// of the Bearer scheme, then the ?token= query parameter. gRPC: metadata
// x-consul-token, then authorization: Bearer <secret>. The first one
// present wins; none is the anonymous token ("").
package token

import (
	"context"
	"net/http"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// Header is the HTTP header, and (lower-cased) the gRPC metadata key, that
// carries a token's secret.
const Header = "X-Consul-Token"

const (
	metadataKey   = "x-consul-token"
	authorization = "authorization"
	bearer        = "Bearer "
)

// FromRequest returns the secret r carries, or "".
func FromRequest(r *http.Request) string {
	if t := r.Header.Get(Header); t != "" {
		return t
	}
	// NB: the canonical key and no query parsing unless a token may be
	// in it: a lower-case key is canonicalized, and a query parsed, into
	// new allocations on every request, tokenless ones included.
	if t, ok := bearerOf(r.Header.Get("Authorization")); ok {
		return t
	}
	if q := r.URL.RawQuery; strings.Contains(q, "token") || strings.Contains(q, "%") {
		return r.URL.Query().Get("token")
	}
	return ""
}

// FromContext returns the secret an incoming gRPC call carries, or "".
// NB: it looks the two keys up rather than take metadata.FromIncomingContext,
// which copies every header of the call into a new map: every call on a
// server with ACLs on pays for this.
func FromContext(ctx context.Context) string {
	if v := metadata.ValueFromIncomingContext(ctx, metadataKey); len(v) > 0 && v[0] != "" {
		return v[0]
	}
	for _, v := range metadata.ValueFromIncomingContext(ctx, authorization) {
		if t, ok := bearerOf(v); ok {
			return t
		}
	}
	return ""
}

func bearerOf(v string) (string, bool) {
	if len(v) > len(bearer) && strings.EqualFold(v[:len(bearer)], bearer) {
		return strings.TrimSpace(v[len(bearer):]), true
	}
	return "", false
}

// PerRPC attaches secret to every call of a gRPC connection. It does not
// require transport security: a plain-text cluster on loopback (lodestone
// dev) may still run with ACLs; docs/security.md says what that exposes.
func PerRPC(secret string) credentials.PerRPCCredentials {
	return perRPC{md: map[string]string{metadataKey: secret}}
}

type perRPC struct{ md map[string]string }

func (p perRPC) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return p.md, nil
}

func (perRPC) RequireTransportSecurity() bool { return false }
