package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/lodestone-kv/lodestone/tlsutil"
)

// TLSConfig turns on TLS for the client gRPC, HTTP and peer listeners and
// for every dial to a peer. It is on when CertFile is set. The peer port
// then always requires and verifies a certificate from the CA that names
// PeerServerName: mutual TLS between members is not optional.
type TLSConfig struct {
	// CAFile verifies client and peer certificates; CertFile and KeyFile
	// are what the gRPC and HTTP listeners serve. All three or none.
	CAFile   string
	CertFile string
	KeyFile  string
	// VerifyIncomingGRPC and VerifyIncomingHTTP require a client
	// certificate from the CA on those listeners; otherwise one is asked
	// for and, if given, must verify.
	VerifyIncomingGRPC bool
	VerifyIncomingHTTP bool
	// PeerCertFile and PeerKeyFile are what the peer port serves and peer
	// dials present; default CertFile and KeyFile.
	PeerCertFile string
	PeerKeyFile  string
	// PeerServerName is the name a peer's certificate must carry, both
	// when it dials in and when it is dialled. Default "server.lodestone",
	// which every `lodestone tls cert create --server/--peer` certificate
	// carries, so members may be dialled by IP.
	PeerServerName string
	// ReloadInterval is how often the files are polled for changes.
	// Default 1s; negative turns polling off (SIGHUP still reloads).
	ReloadInterval time.Duration
}

// Enabled reports whether TLS is configured.
func (t TLSConfig) Enabled() bool { return t.CertFile != "" || t.CAFile != "" || t.KeyFile != "" }

func (t TLSConfig) peerFiles() tlsutil.Files {
	f := tlsutil.Files{CAFile: t.CAFile, CertFile: t.PeerCertFile, KeyFile: t.PeerKeyFile}
	if f.CertFile == "" {
		f.CertFile, f.KeyFile = t.CertFile, t.KeyFile
	}
	return f
}

func (t TLSConfig) peerServerName() string {
	if t.PeerServerName == "" {
		return "server." + tlsutil.DefaultDomain
	}
	return t.PeerServerName
}

func (c *Config) validateTLS() error {
	t := c.TLS
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Err: fmt.Errorf(format, args...)}
	}
	// NB: gossip is not TLS; memberlist's AES key is its protection, and
	// a pool open to the network without it lets anyone mark nodes failed.
	if g := c.Gossip.Pool.BindAddr; g != "" && !loopback(g) && c.Gossip.Pool.EncryptKey == "" && !c.InsecurePlaintext {
		return bad("gossip-encrypt", "refusing to gossip unencrypted on %s, which is not loopback: anyone who can reach it could mark nodes failed and invalidate their sessions. "+
			"Give --gossip-encrypt (a base64 key of 16, 24 or 32 bytes, the same on every member), or pass --insecure-plaintext if this network is trusted", g)
	}
	if !t.Enabled() {
		if t.VerifyIncomingGRPC || t.VerifyIncomingHTTP || t.PeerCertFile != "" || t.PeerKeyFile != "" {
			return bad("tls-cert-file", "TLS options given without --tls-ca-file, --tls-cert-file and --tls-key-file")
		}
		if c.InsecurePlaintext {
			return nil
		}
		var open []string
		for _, l := range [][2]string{{"listen-peer", c.ListenPeer}, {"listen-grpc", c.ListenGRPC}, {"listen-http", c.ListenHTTP}} {
			if !loopback(l[1]) {
				open = append(open, "--"+l[0]+" "+l[1])
			}
		}
		if len(open) > 0 {
			return bad("insecure-plaintext", "refusing to listen in plain text on %s, which is not loopback: anyone who can reach it could read and write the registry and join the Raft cluster. "+
				"Give --tls-ca-file, --tls-cert-file and --tls-key-file (make them with `lodestone tls ca create` and `lodestone tls cert create --server`), "+
				"or pass --insecure-plaintext if this network is trusted", strings.Join(open, ", "))
		}
		return nil
	}
	if t.CAFile == "" || t.CertFile == "" || t.KeyFile == "" {
		return bad("tls-cert-file", "TLS needs all of --tls-ca-file, --tls-cert-file and --tls-key-file (the CA verifies peers, which must present certificates), got CA %q, cert %q, key %q", t.CAFile, t.CertFile, t.KeyFile)
	}
	if (t.PeerCertFile == "") != (t.PeerKeyFile == "") {
		return bad("tls-peer-cert-file", "give --tls-peer-cert-file and --tls-peer-key-file together, or neither to use --tls-cert-file's")
	}
	return nil
}

// loopback reports whether a listen address accepts only local
// connections. A host name other than localhost is not known to.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serverTLS is a server's loaded TLS material: one Store for the client
// listeners and one for the peer port (the same one without separate
// peer files).
type serverTLS struct {
	client, peer *tlsutil.Store
	grpc, http   *tls.Config
	peerServe    *tls.Config
	peerDial     *tls.Config
}

// openTLS loads the configured material, nil without TLS.
func openTLS(c *core) (*serverTLS, error) {
	t := c.cfg.TLS
	if !t.Enabled() {
		return nil, nil
	}
	m := tlsutil.NewMetrics(c.metrics.reg)
	logger := c.logger.With("component", "tls")
	st := &serverTLS{}
	var err error
	files := tlsutil.Files{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile}
	if st.client, err = tlsutil.Load(files, tlsutil.Options{Name: "server", Logger: logger, Metrics: m}); err != nil {
		return nil, fmt.Errorf("TLS: %w", err)
	}
	st.peer = st.client
	if pf := t.peerFiles(); pf != files {
		if st.peer, err = tlsutil.Load(pf, tlsutil.Options{Name: "peer", Logger: logger, Metrics: m}); err != nil {
			return nil, fmt.Errorf("TLS peer certificate: %w", err)
		}
	}
	auth := func(required bool) tlsutil.ClientAuth {
		if required {
			return tlsutil.RequireClientCert
		}
		return tlsutil.OptionalClientCert
	}
	name := t.peerServerName()
	errs := []error{}
	st.grpc, err = st.client.ServerConfig(tlsutil.ServerPolicy{ClientAuth: auth(t.VerifyIncomingGRPC)})
	errs = append(errs, err)
	// NB: http/1.1 only: parked blocking queries (httppark) read HTTP/1.
	st.http, err = st.client.ServerConfig(tlsutil.ServerPolicy{ClientAuth: auth(t.VerifyIncomingHTTP), NextProtos: []string{"http/1.1"}})
	errs = append(errs, err)
	// NB: h2 for the peer gRPC clients; Raft streams offer no ALPN.
	st.peerServe, err = st.peer.ServerConfig(tlsutil.ServerPolicy{ClientAuth: tlsutil.RequireClientCert, ClientName: name, NextProtos: []string{"h2"}})
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	st.peerDial = st.peer.ClientConfig(name)
	return st, nil
}

// grpcOptions are the client gRPC server's credentials.
func (st *serverTLS) grpcOptions() []grpc.ServerOption {
	if st == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(st.grpc))}
}

// httpListener terminates TLS under the HTTP server and httppark, which
// read requests off the connection themselves.
func (st *serverTLS) httpListener(l net.Listener) net.Listener {
	if st == nil {
		return l
	}
	return tls.NewListener(l, st.http)
}

// peerListener terminates TLS under the peer port's multiplexer, which
// then tells Raft streams from gRPC in the decrypted bytes; the handshake
// runs in the multiplexer's per-connection goroutine, bounded by its
// preamble timeout.
func (st *serverTLS) peerListener(l net.Listener) net.Listener {
	if st == nil {
		return l
	}
	return tls.NewListener(l, st.peerServe)
}

func (st *serverTLS) dialConfig() *tls.Config {
	if st == nil {
		return nil
	}
	return st.peerDial
}

func (st *serverTLS) reload() error {
	if st == nil {
		return nil
	}
	err := st.client.Reload()
	if st.peer != st.client {
		err = errors.Join(err, st.peer.Reload())
	}
	return err
}

// watch polls the files until ctx ends, on goroutines wg tracks.
func (st *serverTLS) watch(ctx context.Context, interval time.Duration, wg *sync.WaitGroup) {
	if st == nil || interval < 0 {
		return
	}
	if interval == 0 {
		interval = tlsutil.DefaultWatchInterval
	}
	stores := []*tlsutil.Store{st.client}
	if st.peer != st.client {
		stores = append(stores, st.peer)
	}
	for _, store := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			store.Watch(ctx, interval)
		}()
	}
}

// ReloadTLS re-reads the TLS files (on SIGHUP). Connections stay up; new
// handshakes use the new material. On error the old material stays in
// use. Without TLS it does nothing.
func (s *Server) ReloadTLS() error { return s.tls.reload() }

// TLSEnabled reports whether the server's listeners serve TLS.
func (s *Server) TLSEnabled() bool { return s.tls != nil }

// CheckTLSFiles reads the TLS files c names as a server starting with c
// would, and says which is unreadable or does not fit (a key that is not
// its certificate's, a certificate the CA did not sign); nil without TLS.
// It binds and writes nothing.
func (c *Config) CheckTLSFiles() error {
	t := c.TLS
	if !t.Enabled() {
		return nil
	}
	files := tlsutil.Files{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile}
	if _, err := tlsutil.Load(files, tlsutil.Options{}); err != nil {
		return fmt.Errorf("TLS: %w", err)
	}
	if pf := t.peerFiles(); pf != files {
		if _, err := tlsutil.Load(pf, tlsutil.Options{}); err != nil {
			return fmt.Errorf("TLS peer certificate: %w", err)
		}
	}
	return nil
}
