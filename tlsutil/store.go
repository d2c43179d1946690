package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ClientAuth is what a listener asks of its clients' certificates.
type ClientAuth int

const (
	// NoClientCert asks for none.
	NoClientCert ClientAuth = iota
	// OptionalClientCert asks for one; a client that presents one must
	// present one that verifies (tls.VerifyClientCertIfGiven).
	OptionalClientCert
	// RequireClientCert refuses a client without a valid one
	// (tls.RequireAndVerifyClientCert).
	RequireClientCert
)

// Options configures a Store or an SNI set.
type Options struct {
	// Name labels its metrics and logs ("server", "peer", "gateway-front").
	Name string
	// Logger receives reload logs; nil discards them.
	Logger *slog.Logger
	// Metrics counts reloads; nil counts nothing.
	Metrics *Metrics
	// Now is the clock for expiry checks; nil means time.Now.
	Now func() time.Time
}

func (o *Options) fill() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Metrics are the reload metrics, shared by every Store and SNI set of a
// process.
type Metrics struct {
	reloads  *prometheus.CounterVec
	notAfter *prometheus.GaugeVec
}

// NewMetrics makes lodestone_tls_reloads_total{cert,result} and
// lodestone_tls_cert_not_after_seconds{cert} and registers them with reg
// (nil: not yet; Metrics is a prometheus.Collector to register later).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lodestone_tls_reloads_total",
			Help: "TLS material reloads by result (success, failure); a failure keeps the old material.",
		}, []string{"cert", "result"}),
		notAfter: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lodestone_tls_cert_not_after_seconds",
			Help: "When the serving certificate expires, unix seconds (the earliest of an SNI set).",
		}, []string{"cert"}),
	}
	if reg != nil {
		reg.MustRegister(m)
	}
	return m
}

func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.reloads.Describe(ch)
	m.notAfter.Describe(ch)
}

func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.reloads.Collect(ch)
	m.notAfter.Collect(ch)
}

func (m *Metrics) result(name string, err error) {
	if m == nil {
		return
	}
	r := "success"
	if err != nil {
		r = "failure"
	}
	m.reloads.WithLabelValues(name, r).Inc()
}

func (m *Metrics) expiry(name string, t time.Time) {
	if m != nil && !t.IsZero() {
		m.notAfter.WithLabelValues(name).Set(float64(t.Unix()))
	}
}

// Store holds the current material of one Files and builds configs that
// always use it. Its methods may run concurrently.
type Store struct {
	files Files
	opts  Options
	cur   atomic.Pointer[material]
	mu    sync.Mutex // one reload at a time
}

// Load reads files (see the package doc for what it refuses).
func Load(files Files, opts Options) (*Store, error) {
	opts.fill()
	m, err := load(files, opts.Now())
	if err != nil {
		return nil, err
	}
	s := &Store{files: files, opts: opts}
	s.cur.Store(m)
	if m.cert != nil {
		opts.Metrics.expiry(opts.Name, m.cert.Leaf.NotAfter)
	}
	return s, nil
}

// Files are the files the Store reads.
func (s *Store) Files() Files { return s.files }

// Reload re-reads the files. On error the old material stays in use.
func (s *Store) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := load(s.files, s.opts.Now())
	s.opts.Metrics.result(s.opts.Name, err)
	if err != nil {
		s.opts.Logger.Error("TLS reload failed; keeping the previous certificate and CA bundle", "cert", s.opts.Name, "err", err)
		return err
	}
	s.cur.Store(m)
	if m.cert != nil {
		s.opts.Metrics.expiry(s.opts.Name, m.cert.Leaf.NotAfter)
		s.opts.Logger.Info("TLS material reloaded", "cert", s.opts.Name, "serial", fmt.Sprintf("%x", m.cert.Leaf.SerialNumber),
			"not_after", m.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	} else {
		s.opts.Logger.Info("TLS CA bundle reloaded", "cert", s.opts.Name)
	}
	return nil
}

// Leaf is the current certificate, nil without one.
func (s *Store) Leaf() *x509.Certificate {
	if m := s.cur.Load(); m.cert != nil {
		return m.cert.Leaf
	}
	return nil
}

// base is the policy every config shares.
func base() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// TLS 1.2 only: ECDHE for forward secrecy, AEAD ciphers only.
		// TLS 1.3's suites are not configurable and all AEAD.
		CipherSuites: []uint16{
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
			tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
		},
	}
}

// ServerPolicy is what a listener asks of its clients.
type ServerPolicy struct {
	ClientAuth ClientAuth
	// ClientName, if set, must be a DNS name of the client's certificate
	// (the peer port: server.<domain>).
	ClientName string
	// NextProtos are the ALPN protocols offered (gRPC adds h2 itself).
	NextProtos []string
}

// ServerConfig returns a config serving the current certificate. Asking
// for client certificates needs a CA file to verify them with.
func (s *Store) ServerConfig(p ServerPolicy) (*tls.Config, error) {
	m := s.cur.Load()
	if m.cert == nil {
		return nil, fmt.Errorf("TLS %s: serving needs a certificate and key file", s.opts.Name)
	}
	if (p.ClientAuth != NoClientCert || p.ClientName != "") && m.pool == nil {
		return nil, fmt.Errorf("TLS %s: verifying client certificates needs a CA file", s.opts.Name)
	}
	cfg := base()
	cfg.NextProtos = p.NextProtos
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cur.Load().cert, nil }
	switch p.ClientAuth {
	case NoClientCert:
		return cfg, nil
	case OptionalClientCert:
		cfg.ClientAuth = tls.RequestClientCert
	case RequireClientCert:
		cfg.ClientAuth = tls.RequireAnyClientCert
	default:
		return nil, fmt.Errorf("TLS %s: unknown client auth %d", s.opts.Name, p.ClientAuth)
	}
	// NB: crypto/tls would verify against a fixed ClientCAs; verifying
	// here uses the pool of the moment, so a reloaded CA bundle applies
	// to the next handshake without a new listener.
	cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			if p.ClientAuth == RequireClientCert {
				return errors.New("a client certificate is required")
			}
			return nil
		}
		return verifyPeer(raw, s.cur.Load().pool, x509.ExtKeyUsageClientAuth, p.ClientName, s.opts.Now())
	}
	return cfg, nil
}

// ClientConfig returns a config that presents the current certificate
// (if any) and verifies the server against the CA file (the system roots
// without one). With serverName set, the server's certificate must name
// it and is verified against the CA pool of the moment. With serverName
// empty, the dialler's address is the name (crypto/tls's own check) and
// the pool is the one loaded now (see the package doc).
func (s *Store) ClientConfig(serverName string) *tls.Config {
	cfg := base()
	cfg.ServerName = serverName
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if c := s.cur.Load().cert; c != nil {
			return c, nil
		}
		return &tls.Certificate{}, nil // NB: none: send an empty one
	}
	m := s.cur.Load()
	if m.pool == nil || serverName == "" {
		cfg.RootCAs = m.pool
		return cfg
	}
	// NB: InsecureSkipVerify only hands verification to VerifyConnection,
	// which does all of it (chain, usage, name) with the current pool.
	cfg.InsecureSkipVerify = true
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		raw := make([][]byte, len(cs.PeerCertificates))
		for i, c := range cs.PeerCertificates {
			raw[i] = c.Raw
		}
		return verifyPeer(raw, s.cur.Load().pool, x509.ExtKeyUsageServerAuth, serverName, s.opts.Now())
	}
	return cfg
}
