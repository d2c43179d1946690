package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lodestone-kv/lodestone/gateway"
	"github.com/lodestone-kv/lodestone/tlsutil"
)

// gatewayTLSOptions are the gateway's TLS flags.
type gatewayTLSOptions struct {
	certs                        []string // host=cert.pem,key.pem
	certDir                      string
	adminCert, adminKey, adminCA string
}

func addGatewayTLSFlags(f *pflag.FlagSet, o *gatewayTLSOptions) {
	f.StringArrayVar(&o.certs, "tls-cert", nil, "serve TLS on --listen with this certificate for a host: host=cert.pem,key.pem; host may be *.example.com or \"default\" (for clients without a matching name); repeatable")
	f.StringVar(&o.certDir, "tls-cert-dir", "", "serve TLS on --listen with every <name>.pem and <name>-key.pem in this directory, each for the DNS names it carries; default.pem is the default")
	f.StringVar(&o.adminCert, "admin-tls-cert-file", "", "serve TLS on --admin with this certificate")
	f.StringVar(&o.adminKey, "admin-tls-key-file", "", "key of --admin-tls-cert-file")
	f.StringVar(&o.adminCA, "admin-tls-ca-file", "", "require admin clients to present a certificate from this CA")
}

// gatewayTLS is the gateway's loaded TLS material, reloaded as a whole.
type gatewayTLS struct {
	metrics  *tlsutil.Metrics
	front    *tlsutil.SNI
	admin    *tlsutil.Store
	registry *tlsutil.Store
}

// setup loads the flags' files into cfg's TLS configs.
func (o *gatewayTLSOptions) setup(cmd *cobra.Command, cfg *gateway.Config, logger *slog.Logger) (*gatewayTLS, error) {
	m := tlsutil.NewMetrics(nil) // NB: registered with the gateway's registry once it exists
	logger = logger.With("component", "tls")
	g := &gatewayTLS{metrics: m}
	var err error
	if len(o.certs) > 0 || o.certDir != "" {
		var entries []tlsutil.SNIEntry
		for _, c := range o.certs {
			host, files, ok := strings.Cut(c, "=")
			cert, key, ok2 := strings.Cut(files, ",")
			if !ok || !ok2 || host == "" || cert == "" || key == "" {
				return nil, usagef(cmd, "--tls-cert %q: use host=cert.pem,key.pem", c)
			}
			entries = append(entries, tlsutil.SNIEntry{Host: host, CertFile: cert, KeyFile: key})
		}
		if g.front, err = tlsutil.LoadSNI(o.certDir, entries, tlsutil.Options{Name: "gateway-front", Logger: logger, Metrics: m}); err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-cert-dir: %w", err)
		}
		// NB: http/1.1 only: the front speaks HTTP/1.1 to clients.
		cfg.FrontTLS = g.front.ServerConfig("http/1.1")
	}
	if o.adminCert != "" || o.adminKey != "" || o.adminCA != "" {
		if o.adminCert == "" || o.adminKey == "" {
			return nil, usagef(cmd, "--admin-tls-cert-file and --admin-tls-key-file go together (--admin-tls-ca-file adds client verification)")
		}
		files := tlsutil.Files{CAFile: o.adminCA, CertFile: o.adminCert, KeyFile: o.adminKey}
		if g.admin, err = tlsutil.Load(files, tlsutil.Options{Name: "gateway-admin", Logger: logger, Metrics: m}); err != nil {
			return nil, fmt.Errorf("--admin-tls-*: %w", err)
		}
		auth := tlsutil.NoClientCert
		if o.adminCA != "" {
			auth = tlsutil.RequireClientCert
		}
		if cfg.AdminTLS, err = g.admin.ServerConfig(tlsutil.ServerPolicy{ClientAuth: auth, NextProtos: []string{"h2", "http/1.1"}}); err != nil {
			return nil, err
		}
	}
	var name string
	if g.registry, name, err = clientTLSStore(cmd, tlsutil.Options{Name: "gateway-registry", Logger: logger, Metrics: m}); err != nil {
		return nil, err
	}
	if g.registry != nil {
		cfg.RegistryTLS = g.registry.ClientConfig(name)
	}
	return g, nil
}

// reload re-reads every file; each part keeps its old material on error.
func (g *gatewayTLS) reload() error {
	var errs []error
	if g.front != nil {
		errs = append(errs, g.front.Reload())
	}
	if g.admin != nil {
		errs = append(errs, g.admin.Reload())
	}
	if g.registry != nil {
		errs = append(errs, g.registry.Reload())
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// watch reloads each part when its files change, until ctx ends.
func (g *gatewayTLS) watch(ctx context.Context) {
	if g.front != nil {
		go g.front.Watch(ctx, tlsutil.DefaultWatchInterval)
	}
	if g.admin != nil {
		go g.admin.Watch(ctx, tlsutil.DefaultWatchInterval)
	}
	if g.registry != nil {
		go g.registry.Watch(ctx, tlsutil.DefaultWatchInterval)
	}
}
