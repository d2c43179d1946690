package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/chaos/check"
	"github.com/lodestone-kv/lodestone/chaos/cluster"
	"github.com/lodestone-kv/lodestone/internal/token"
)

// proveSecurity shows, before any workload runs, that the secure cluster
// really is secure: a client that leaked through without TLS, without a
// client certificate or without a token is refused, and the workloads'
// token is refused what its policy does not grant. Each probe is one call
// that the cluster must refuse (none of them writes anything the checkers
// see: refused writes are never applied, and the allowed probe is a read).
// It returns a one-line account for the log and the report.
func proveSecurity(ctx context.Context, c *cluster.Cluster) (string, error) {
	sec := c.Security()
	if sec == nil {
		return "off (--plaintext): no TLS, no ACLs", nil
	}
	n := c.Nodes[0]
	addr := n.Conn.Target()
	probeKey := []byte(check.Prefix + "security-probe")
	var proven []string
	// call runs one RPC on a fresh connection made with opts.
	call := func(opts []grpc.DialOption, rpc func(context.Context, *grpc.ClientConn) error) error {
		conn, err := grpc.NewClient(addr, opts...)
		if err != nil {
			return err
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		return rpc(cctx, conn)
	}
	statusRPC := func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := lodestonepb.NewClusterClient(conn).Status(ctx, &lodestonepb.StatusRequest{})
		return err
	}
	get := func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := lodestonepb.NewKVClient(conn).Get(ctx, &lodestonepb.GetRequest{Key: probeKey})
		return err
	}
	refused := func(what string, err error, want codes.Code) error {
		if err == nil {
			return fmt.Errorf("security is not on: %s was served", what)
		}
		if got := status.Code(err); got != want {
			return fmt.Errorf("%s: got %v, want %v: %w", what, got, want, err)
		}
		proven = append(proven, fmt.Sprintf("%s: %v", what, want))
		return nil
	}
	tlsWith := func(cfg *tls.Config) grpc.DialOption {
		return grpc.WithTransportCredentials(credentials.NewTLS(cfg))
	}

	// Transport: the open Status method, which any client may call once
	// its connection is accepted.
	if err := refused("plain-text gRPC", call([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, statusRPC), codes.Unavailable); err != nil {
		return "", err
	}
	if err := refused("TLS without a client certificate", call([]grpc.DialOption{tlsWith(sec.NoCertTLS())}, statusRPC), codes.Unavailable); err != nil {
		return "", err
	}
	// Tokens: with the client certificate, a read of a workload key.
	if err := refused("no token", call([]grpc.DialOption{tlsWith(sec.ClientTLS())}, get), codes.PermissionDenied); err != nil {
		return "", err
	}
	if err := refused("unknown token", call([]grpc.DialOption{tlsWith(sec.ClientTLS()),
		grpc.WithPerRPCCredentials(token.PerRPC("00000000-0000-4000-8000-000000000000"))}, get), codes.PermissionDenied); err != nil {
		return "", err
	}
	// The workloads' own connection: allowed its keys, nothing else.
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := get(cctx, n.Conn); err != nil {
		return "", fmt.Errorf("the workload token cannot read %s: %w", probeKey, err)
	}
	_, err := lodestonepb.NewKVClient(n.Conn).Put(cctx, &lodestonepb.PutRequest{Key: []byte("chaos-outside/x"), Value: []byte("x")})
	if err := refused("workload token writing outside its prefixes", err, codes.PermissionDenied); err != nil {
		return "", err
	}
	_, err = lodestonepb.NewAdminClient(n.Conn).GetAdmission(cctx, &lodestonepb.GetAdmissionRequest{})
	if err := refused("workload token reading operator state", err, codes.PermissionDenied); err != nil {
		return "", err
	}
	// HTTP: plain text and HTTPS without a client certificate get no
	// answer from /readyz.
	for _, p := range []struct {
		what string
		url  string
		cfg  *tls.Config
	}{
		{"plain HTTP", strings.Replace(c.URL(n), "https://", "http://", 1) + "/readyz", nil},
		{"HTTPS without a client certificate", c.URL(n) + "/readyz", sec.NoCertTLS()},
	} {
		hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: p.cfg, DisableKeepAlives: true}}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
		resp, err := hc.Do(req)
		how := "no connection"
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return "", fmt.Errorf("security is not on: %s /readyz answered 200", p.what)
			}
			how = resp.Status
		}
		proven = append(proven, p.what+": "+how)
	}
	return "TLS with client certificates on every port, ACLs default deny; refused as expected: " + strings.Join(proven, ", "), nil
}
