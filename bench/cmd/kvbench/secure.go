package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	consul "github.com/hashicorp/consul/api"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/tlsutil"
)

// benchPrefix is the key range the bench writes (kvbench/<client>/<seq>
// and the probe, kvbench/probe); the secure runs' bench credentials may
// write there and nowhere else.
const benchPrefix = "kvbench/"

// secureFiles is one CA and the certificates both secure systems use:
// one server certificate per member (server.lodestone, <n>.server.lodestone,
// localhost, 127.0.0.1; serverAuth and clientAuth, so members present it to
// each other too) and one client certificate for the bench (clientAuth
// only). Both systems get the same kind of key (ECDSA P-256) and the bench
// dials both with the same client config (tlsutil.ClientConfig).
type secureFiles struct {
	ca        string
	cert, key map[string]string // member name -> server certificate and key
	client    *tls.Config
	// http is an HTTP client over client: the members' HTTP ports (ACL
	// setup, metrics, profiles). It keeps no idle connection, since the
	// members it talks to stop and start again between workloads.
	http       *http.Client
	clientCert string
	clientKey  string
}

// newSecureFiles issues the CA and certificates into dir.
func newSecureFiles(dir string, names []string) (*secureFiles, error) {
	ca, err := tlsutil.CreateCA(tlsutil.CAOptions{})
	if err != nil {
		return nil, fmt.Errorf("create CA: %w", err)
	}
	s := &secureFiles{
		ca:   filepath.Join(dir, "ca.pem"),
		cert: map[string]string{}, key: map[string]string{},
		clientCert: filepath.Join(dir, "client-kvbench.pem"), clientKey: filepath.Join(dir, "client-kvbench-key.pem"),
	}
	if err := tlsutil.WriteFiles(ca, s.ca, filepath.Join(dir, "ca-key.pem")); err != nil {
		return nil, err
	}
	for _, n := range names {
		p, err := tlsutil.CreateCert(tlsutil.CertOptions{Kind: tlsutil.KindServer, Node: n, CA: ca})
		if err != nil {
			return nil, fmt.Errorf("create server certificate %s: %w", n, err)
		}
		s.cert[n], s.key[n] = filepath.Join(dir, "server-"+n+".pem"), filepath.Join(dir, "server-"+n+"-key.pem")
		if err := tlsutil.WriteFiles(p, s.cert[n], s.key[n]); err != nil {
			return nil, err
		}
	}
	p, err := tlsutil.CreateCert(tlsutil.CertOptions{Kind: tlsutil.KindClient, Node: "kvbench", CA: ca})
	if err != nil {
		return nil, fmt.Errorf("create client certificate: %w", err)
	}
	if err := tlsutil.WriteFiles(p, s.clientCert, s.clientKey); err != nil {
		return nil, err
	}
	st, err := tlsutil.Load(tlsutil.Files{CAFile: s.ca, CertFile: s.clientCert, KeyFile: s.clientKey}, tlsutil.Options{Name: "kvbench"})
	if err != nil {
		return nil, err
	}
	// No server name: the dialled address (127.0.0.1) is checked against
	// the server certificate's IP SAN, as the CLI and Go client do.
	s.client = st.ClientConfig("")
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = s.client
	tr.DisableKeepAlives = true
	s.http = &http.Client{Transport: tr}
	return s, nil
}

// lodestoneACL makes a fresh secure Lodestone cluster ready for the bench,
// as an operator would: bootstrap the ACL system on the leader (the
// management token), create a policy that may write the bench prefix and
// nothing else, and a token with it. Every bench connection then sends
// that token with each call (x-consul-token, as the Go client does). It
// also returns the management token's secret (-pprof uses it).
func lodestoneACL(ctx context.Context, sec *secureFiles, httpAddr string) (secret, mgmtSecret string, _ error) {
	cli, err := consul.NewClient(&consul.Config{Address: httpAddr, Scheme: "https", HttpClient: sec.http})
	if err != nil {
		return "", "", fmt.Errorf("consul api client: %w", err)
	}
	q := (&consul.WriteOptions{}).WithContext(ctx)
	mgmt, _, err := cli.ACL().Bootstrap()
	if err != nil {
		return "", "", fmt.Errorf("acl bootstrap on %s: %w", httpAddr, err)
	}
	q.Token = mgmt.SecretID
	pol, _, err := cli.ACL().PolicyCreate(&consul.ACLPolicy{
		Name:  "kvbench",
		Rules: fmt.Sprintf("key_prefix %q { policy = \"write\" }", benchPrefix),
	}, q)
	if err != nil {
		return "", "", fmt.Errorf("acl policy create: %w", err)
	}
	tok, _, err := cli.ACL().TokenCreate(&consul.ACLToken{
		Description: "kvbench writer",
		Policies:    []*consul.ACLTokenPolicyLink{{ID: pol.ID}},
	}, q)
	if err != nil {
		return "", "", fmt.Errorf("acl token create: %w", err)
	}
	return tok.SecretID, mgmt.SecretID, nil
}

// etcd's users: root (auth enable needs it) and the bench's, whose role may
// read and write the bench prefix and nothing else.
const (
	etcdRootUser  = "root"
	etcdRootPass  = "kvbench-root"
	etcdBenchUser = "kvbench"
	etcdBenchPass = "kvbench-pass"
	etcdBenchRole = "kvbench"
)

// etcdAuth makes a fresh secure etcd cluster ready for the bench, as an
// operator would with etcdctl: a root user with the root role, a bench
// role with readwrite on [kvbench/, kvbench0), a bench user with that
// role, then auth enable.
func etcdAuth(ctx context.Context, sec *secureFiles, endpoint string) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: sec.client, Logger: zap.NewNop(), Context: ctx})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer cli.Close()
	steps := []struct {
		what string
		do   func() error
	}{
		{"user add root", func() error { _, err := cli.UserAdd(ctx, etcdRootUser, etcdRootPass); return err }},
		{"user grant-role root root", func() error { _, err := cli.UserGrantRole(ctx, etcdRootUser, "root"); return err }},
		{"role add", func() error { _, err := cli.RoleAdd(ctx, etcdBenchRole); return err }},
		{"role grant-permission", func() error {
			_, err := cli.RoleGrantPermission(ctx, etcdBenchRole, benchPrefix, clientv3.GetPrefixRangeEnd(benchPrefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		}},
		{"user add bench", func() error { _, err := cli.UserAdd(ctx, etcdBenchUser, etcdBenchPass); return err }},
		{"user grant-role bench", func() error { _, err := cli.UserGrantRole(ctx, etcdBenchUser, etcdBenchRole); return err }},
		{"auth enable", func() error { _, err := cli.AuthEnable(ctx); return err }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("etcd %s: %w", s.what, err)
		}
	}
	return nil
}

// etcdToken is the bench's per-connection etcd credential, as clientv3's
// own (its authTokenBundle): empty until Authenticate on the connection
// has returned a token, then sent as the "token" metadata of every call.
type etcdToken struct{ tok atomic.Pointer[string] }

func (t *etcdToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if p := t.tok.Load(); p != nil {
		return map[string]string{"token": *p}, nil
	}
	return nil, nil
}

func (*etcdToken) RequireTransportSecurity() bool { return false }

var _ credentials.PerRPCCredentials = (*etcdToken)(nil)

// etcdLogin dials addr with the bench user's credentials: Authenticate
// (username and password) on the new connection, as clientv3 does when it
// is given a Username, then every call carries the token it returned.
func etcdLogin(ctx context.Context, sys system, addr string) (*grpc.ClientConn, error) {
	tok := &etcdToken{}
	conn, err := sys.dial(addr, grpc.WithPerRPCCredentials(tok))
	if err != nil {
		return nil, err
	}
	resp, err := etcdserverpb.NewAuthClient(conn).Authenticate(ctx, &etcdserverpb.AuthenticateRequest{Name: etcdBenchUser, Password: etcdBenchPass})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("etcd authenticate %s on %s: %w", etcdBenchUser, addr, err)
	}
	tok.tok.Store(&resp.Token)
	return conn, nil
}

// checkSecure makes sure a secure cluster measures what it claims to:
// with the bench's credentials a put outside the bench prefix is refused,
// a put inside it without credentials is refused, and a connection
// without a client certificate is refused. It fails the run otherwise.
func (c *cluster) checkSecure(ctx context.Context) error {
	noCert := c.sys.sec.client.Clone()
	noCert.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	checks := []struct {
		what string
		key  string
		conn func() (*grpc.ClientConn, error)
	}{
		{"a put outside " + benchPrefix + " with the bench's credentials", "kvbench-outside/x",
			func() (*grpc.ClientConn, error) { return c.connect(ctx, c.leader) }},
		{"a put without credentials", benchPrefix + "anonymous",
			func() (*grpc.ClientConn, error) { return c.sys.dial(c.leader) }},
		{"a put without a client certificate", benchPrefix + "no-cert",
			func() (*grpc.ClientConn, error) {
				return grpc.NewClient("passthrough:///"+c.leader, append(slices.Clone(c.sys.dialOptions),
					grpc.WithTransportCredentials(credentials.NewTLS(noCert)))...)
			}},
	}
	for _, ch := range checks {
		conn, err := ch.conn()
		if err != nil {
			return fmt.Errorf("secure setup check: %s: %w", ch.what, err)
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = c.sys.stubPut(conn)(pctx, []byte(ch.key), []byte("x"))
		cancel()
		conn.Close()
		if err == nil {
			return fmt.Errorf("secure setup check: %s was accepted", ch.what)
		}
		if errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded {
			return fmt.Errorf("secure setup check: %s got no answer: %w", ch.what, err)
		}
	}
	return nil
}
