package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lodestone-kv/lodestone/internal/token"
	"github.com/lodestone-kv/lodestone/tlsutil"
)

// Security is what a secure cluster (the default) runs with: one CA for
// the campaign, a server certificate per member name, the harness's
// client certificate, and two ACL tokens whose secrets the harness picks
// before the cluster exists (so connections can be dialled at once and a
// bootstrap whose answer was lost can be retried).
//
//   - Management (the bootstrap token) is used by the harness itself:
//     membership changes, the fault hooks, status and member lists.
//   - Workload carries Options.WorkloadRules and is on every Node.Conn:
//     each workload operation passes the server's authorization.
//   - Hostile carries Options.HostileRules (when set): the hostile
//     client's own token, with its own client certificate (HostileTLS),
//     an authenticated client that misbehaves.
type Security struct {
	// Dir holds ca.pem, client.pem, hostile.pem and <member>.pem with
	// their keys.
	Dir                           string
	CAFile                        string
	Management, Workload, Hostile string
	client, hostile               *tlsutil.Store
	ca                            tlsutil.PEM
}

// WorkloadPolicy is the name of the workload token's policy;
// HostilePolicy the hostile client's.
const (
	WorkloadPolicy = "chaos-workload"
	HostilePolicy  = "chaos-hostile"
)

func newSecurity(dir string) (*Security, error) {
	s := &Security{Dir: filepath.Join(dir, "tls")}
	s.CAFile = filepath.Join(s.Dir, "ca.pem")
	var err error
	if s.ca, err = tlsutil.CreateCA(tlsutil.CAOptions{CommonName: "Lodestone chaos CA", Days: 2}); err != nil {
		return nil, fmt.Errorf("create CA: %w", err)
	}
	if err := tlsutil.WriteFiles(s.ca, s.CAFile, filepath.Join(s.Dir, "ca-key.pem")); err != nil {
		return nil, fmt.Errorf("write CA: %w", err)
	}
	if s.client, err = s.clientCert("chaos", "client"); err != nil {
		return nil, err
	}
	if s.hostile, err = s.clientCert("hostile", "hostile"); err != nil {
		return nil, err
	}
	s.Management, s.Workload, s.Hostile = newSecret(), newSecret(), newSecret()
	return s, nil
}

// clientCert issues a client certificate for node, writes it as
// <file>.pem and <file>-key.pem, and loads it.
func (s *Security) clientCert(node, file string) (*tlsutil.Store, error) {
	cl, err := tlsutil.CreateCert(tlsutil.CertOptions{Kind: tlsutil.KindClient, Node: node, Days: 2, CA: s.ca})
	if err != nil {
		return nil, fmt.Errorf("create %s certificate: %w", file, err)
	}
	certFile, keyFile := filepath.Join(s.Dir, file+".pem"), filepath.Join(s.Dir, file+"-key.pem")
	if err := tlsutil.WriteFiles(cl, certFile, keyFile); err != nil {
		return nil, fmt.Errorf("write %s certificate: %w", file, err)
	}
	st, err := tlsutil.Load(tlsutil.Files{CAFile: s.CAFile, CertFile: certFile, KeyFile: keyFile}, tlsutil.Options{Name: node})
	if err != nil {
		return nil, fmt.Errorf("load %s certificate: %w", file, err)
	}
	return st, nil
}

// newSecret is a random UUID (version 4), the shape of Consul's secrets.
func newSecret() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // NB: crypto/rand.Read never fails (Go 1.24+)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// ClientTLS is a client config with the harness's certificate that
// verifies a server's certificate against the campaign CA and the dialled
// address (every server certificate names its namespace IP).
func (s *Security) ClientTLS() *tls.Config { return s.client.ClientConfig("") }

// HostileTLS is ClientTLS with the hostile client's own certificate.
func (s *Security) HostileTLS() *tls.Config { return s.hostile.ClientConfig("") }

// NoCertTLS verifies servers like ClientTLS but presents no certificate.
func (s *Security) NoCertTLS() *tls.Config {
	cfg := s.client.ClientConfig("")
	cfg.GetClientCertificate = nil
	return cfg
}

// serverFiles returns the member's certificate and key, issuing them on
// first use: a restarted member keeps its files, a new member (a new
// name) gets its own.
func (s *Security) serverFiles(name, ip string) (cert, key string, err error) {
	cert, key = filepath.Join(s.Dir, name+".pem"), filepath.Join(s.Dir, name+"-key.pem")
	if _, err := os.Stat(cert); err == nil {
		return cert, key, nil
	}
	p, err := tlsutil.CreateCert(tlsutil.CertOptions{Kind: tlsutil.KindServer, Node: name, IPs: []net.IP{net.ParseIP(ip)}, Days: 2, CA: s.ca})
	if err != nil {
		return "", "", fmt.Errorf("create certificate of %s: %w", name, err)
	}
	if err := tlsutil.WriteFiles(p, cert, key); err != nil {
		return "", "", fmt.Errorf("write certificate of %s: %w", name, err)
	}
	return cert, key, nil
}

// serverArgs are the TLS and ACL flags of a member.
func (s *Security) serverArgs(name, ip string) ([]string, error) {
	cert, key, err := s.serverFiles(name, ip)
	if err != nil {
		return nil, err
	}
	return []string{"--tls-ca-file", s.CAFile, "--tls-cert-file", cert, "--tls-key-file", key,
		"--tls-verify-incoming-grpc", "--tls-verify-incoming-http",
		"--acl-enabled", "--acl-default-policy", "deny"}, nil
}

// dialOptions are the transport and token of one connection: TLS with the
// client certificate and secret on every call; plain text without token
// when s is nil.
func (s *Security) dialOptions(secret string) []grpc.DialOption {
	if s == nil {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(s.ClientTLS())),
		grpc.WithPerRPCCredentials(token.PerRPC(secret)),
	}
}

// httpClient is the harness's client for /readyz, the ACL endpoints and
// the fault hooks.
func (s *Security) httpClient() *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	if s != nil {
		tr.TLSClientConfig = s.ClientTLS()
	}
	return &http.Client{Timeout: 2 * time.Second, Transport: tr}
}

// Security is the cluster's TLS and ACL material; nil for a plain-text
// cluster.
func (c *Cluster) Security() *Security { return c.sec }

// URL is the node's HTTP(S) base URL.
func (c *Cluster) URL(n *Node) string {
	if c.sec == nil {
		return "http://" + n.httpAddr()
	}
	return "https://" + n.httpAddr()
}

// aclCall is one request to a node's Consul ACL API with the given
// secret; it returns the status and body.
func (c *Cluster) aclCall(ctx context.Context, n *Node, method, path, secret string, in any) (int, []byte, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL(n)+path, body)
	if err != nil {
		return 0, nil, err
	}
	if secret != "" {
		req.Header.Set(token.Header, secret)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, b, nil
}

// bootstrapACL makes the management token (the bootstrap token with the
// harness's secret), the workload policy and the workload token, then
// waits until every node resolves the workload token. Each step is
// retried until it took effect: bootstrap answers 500 until a leader
// exists, and an answer lost to a leader change is settled by reading.
func (c *Cluster) bootstrapACL(ctx context.Context, rules string, within time.Duration) error {
	s := c.sec
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	type step struct {
		what string
		do   func(n *Node) (int, []byte, error)
		// done reports whether the step already took effect.
		done func(n *Node) bool
	}
	self := func(secret string) func(n *Node) bool {
		return func(n *Node) bool {
			code, _, err := c.aclCall(ctx, n, http.MethodGet, "/v1/acl/token/self", secret, nil)
			return err == nil && code == http.StatusOK
		}
	}
	steps := []step{
		{"bootstrap", func(n *Node) (int, []byte, error) {
			return c.aclCall(ctx, n, http.MethodPut, "/v1/acl/bootstrap", "", map[string]string{"BootstrapSecret": s.Management})
		}, self(s.Management)},
		{"create policy " + WorkloadPolicy, func(n *Node) (int, []byte, error) {
			return c.aclCall(ctx, n, http.MethodPut, "/v1/acl/policy", s.Management, map[string]string{
				"Name": WorkloadPolicy, "Description": "what the chaos workloads may do", "Rules": rules})
		}, func(n *Node) bool {
			code, _, err := c.aclCall(ctx, n, http.MethodGet, "/v1/acl/policy/name/"+WorkloadPolicy, s.Management, nil)
			return err == nil && code == http.StatusOK
		}},
		{"create workload token", func(n *Node) (int, []byte, error) {
			return c.aclCall(ctx, n, http.MethodPut, "/v1/acl/token", s.Management, map[string]any{
				"SecretID": s.Workload, "Description": "chaos workload",
				"Policies": []map[string]string{{"Name": WorkloadPolicy}}})
		}, self(s.Workload)},
	}
	if c.opts.HostileRules != "" {
		steps = append(steps, step{"create policy " + HostilePolicy, func(n *Node) (int, []byte, error) {
			return c.aclCall(ctx, n, http.MethodPut, "/v1/acl/policy", s.Management, map[string]string{
				"Name": HostilePolicy, "Description": "what the hostile chaos client may do", "Rules": c.opts.HostileRules})
		}, func(n *Node) bool {
			code, _, err := c.aclCall(ctx, n, http.MethodGet, "/v1/acl/policy/name/"+HostilePolicy, s.Management, nil)
			return err == nil && code == http.StatusOK
		}}, step{"create hostile token", func(n *Node) (int, []byte, error) {
			return c.aclCall(ctx, n, http.MethodPut, "/v1/acl/token", s.Management, map[string]any{
				"SecretID": s.Hostile, "Description": "chaos hostile client",
				"Policies": []map[string]string{{"Name": HostilePolicy}}})
		}, self(s.Hostile)})
	}
	for _, st := range steps {
		var last error
		for attempt := 0; ; attempt++ {
			if ctx.Err() != nil {
				return fmt.Errorf("ACL %s: %w (last: %v)", st.what, ctx.Err(), last)
			}
			// NB: until the bootstrap applied, Status refuses the
			// management secret and no leader is found: the nodes take
			// turns (a follower hands the write to the leader).
			n, _ := c.Leader(ctx)
			if n == nil {
				n = c.Nodes[attempt%len(c.Nodes)]
			}
			code, body, err := st.do(n)
			if err == nil && code == http.StatusOK {
				break
			}
			if st.done(n) {
				break
			}
			if err == nil {
				err = fmt.Errorf("%s: %d %s", n.Name(), code, strings.TrimSpace(string(body)))
			}
			last = err
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	// Followers apply the token a moment later; the workloads start only
	// once every node would let them in.
	ready := self(s.Workload)
	if c.opts.HostileRules != "" {
		ready = func(n *Node) bool { return self(s.Workload)(n) && self(s.Hostile)(n) }
	}
	for _, n := range c.Nodes {
		for !ready(n) {
			if ctx.Err() != nil {
				return fmt.Errorf("ACL: %s does not know the workload token: %w", n.Name(), ctx.Err())
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	c.logger.Info("ACLs bootstrapped", "took", time.Since(start).Round(time.Millisecond))
	return nil
}
