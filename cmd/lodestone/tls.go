package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lodestone-kv/lodestone/tlsutil"
)

// The client TLS flags and the environment variables that supply their
// defaults; Consul's names are honoured too, so an operator's existing
// environment works.
var clientTLSFlags = []struct{ flag, env, consulEnv, usage string }{
	{"ca-file", "LODESTONE_CACERT", "CONSUL_CACERT", "CA bundle that verifies the servers; turns on TLS"},
	{"cert-file", "LODESTONE_CLIENT_CERT", "CONSUL_CLIENT_CERT", "client certificate to present (with --key-file)"},
	{"key-file", "LODESTONE_CLIENT_KEY", "CONSUL_CLIENT_KEY", "key of --cert-file"},
	{"tls-server-name", "LODESTONE_TLS_SERVER_NAME", "CONSUL_TLS_SERVER_NAME", "name the servers' certificates must carry (default: the endpoint's host; server.lodestone fits every server certificate)"},
}

// addClientTLSFlags adds the client TLS flags to the root's persistent
// flags.
func addClientTLSFlags(pf *pflag.FlagSet, getenv func(string) string) {
	for _, f := range clientTLSFlags {
		def := getenv(f.env)
		if def == "" {
			def = getenv(f.consulEnv)
		}
		pf.String(f.flag, def, f.usage+" (env "+f.env+" or "+f.consulEnv+")")
	}
}

// clientTLS builds the client TLS config from the persistent flags; nil
// when none is given (plain text).
func clientTLS(cmd *cobra.Command) (*tls.Config, error) {
	s, name, err := clientTLSStore(cmd, tlsutil.Options{Name: "client"})
	if s == nil || err != nil {
		return nil, err
	}
	return s.ClientConfig(name), nil
}

// clientTLSStore loads the persistent client TLS flags' files, for a
// long-lived process that reloads them; nil without any.
func clientTLSStore(cmd *cobra.Command, opts tlsutil.Options) (*tlsutil.Store, string, error) {
	get := func(name string) string {
		v, _ := cmd.Flags().GetString(name)
		return v
	}
	files := tlsutil.Files{CAFile: get("ca-file"), CertFile: get("cert-file"), KeyFile: get("key-file")}
	if files == (tlsutil.Files{}) {
		if get("tls-server-name") != "" {
			return nil, "", usagef(cmd, "--tls-server-name needs --ca-file")
		}
		return nil, "", nil
	}
	s, err := tlsutil.Load(files, opts)
	if err != nil {
		return nil, "", usagef(cmd, "--ca-file/--cert-file/--key-file: %v", err)
	}
	return s, get("tls-server-name"), nil
}

func newTLSCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tls",
		Short: "Create a CA and the certificates servers, peers and clients present",
		Long: `Create a private CA and certificates signed by it, as consul tls does.
Keys are ECDSA P-256, written mode 0600; existing files are never replaced.

  lodestone tls ca create
  lodestone tls cert create --server --node n1 --additional-ipaddress 10.0.0.1
  lodestone tls cert create --client --node ops

Then start each server with
  --tls-ca-file lodestone-ca.pem --tls-cert-file server-n1.pem --tls-key-file server-n1-key.pem
and give clients --ca-file, --cert-file and --key-file.`,
		Args: cobra.NoArgs,
		RunE: groupRunE,
	}
	ca := &cobra.Command{Use: "ca", Short: "Manage the CA", Args: cobra.NoArgs, RunE: groupRunE}
	ca.AddCommand(newTLSCACreateCmd())
	cert := &cobra.Command{Use: "cert", Short: "Manage certificates", Args: cobra.NoArgs, RunE: groupRunE}
	cert.AddCommand(newTLSCertCreateCmd())
	cmd.AddCommand(ca, cert)
	return cmd
}

// CA file names, in --dir.
const (
	caCertName = "lodestone-ca.pem"
	caKeyName  = "lodestone-ca-key.pem"
)

func newTLSCACreateCmd() *cobra.Command {
	var o tlsutil.CAOptions
	var dir string
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a CA: " + caCertName + " and " + caKeyName,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Days <= 0 {
				return usagef(cmd, "--days %d: must be positive", o.Days)
			}
			p, err := tlsutil.CreateCA(o)
			if err != nil {
				return err
			}
			cf, kf := filepath.Join(dir, caCertName), filepath.Join(dir, caKeyName)
			if err := tlsutil.WriteFiles(p, cf, kf); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "==> Saved %s\n==> Saved %s\n", cf, kf)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Days, "days", 1825, "days the CA is valid")
	f.StringVar(&o.Domain, "domain", tlsutil.DefaultDomain, "domain certificate names live under")
	f.StringVar(&o.CommonName, "common-name", "", "CA common name (default \"Lodestone CA <domain>\")")
	f.StringVar(&dir, "dir", ".", "directory to write the files to")
	return cmd
}

func newTLSCertCreateCmd() *cobra.Command {
	var (
		server, client, peer bool
		o                    tlsutil.CertOptions
		caFile, keyFile, dir string
		ips                  []string
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a server, peer or client certificate: <kind>-<node>.pem and <kind>-<node>-key.pem",
		Long: `Create a certificate signed by the CA. Server and peer certificates carry the
names server.<domain>, <node>.server.<domain>, localhost and 127.0.0.1, and both
the serverAuth and clientAuth usages (members dial each other); client
certificates carry client.<domain>, <node>.client.<domain> and localhost, and
clientAuth only. Add the addresses clients dial with --additional-dnsname and
--additional-ipaddress, or have clients verify server.<domain> (--tls-server-name).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n := 0
			for kind, set := range map[tlsutil.Kind]bool{tlsutil.KindServer: server, tlsutil.KindClient: client, tlsutil.KindPeer: peer} {
				if set {
					o.Kind = kind
					n++
				}
			}
			if n != 1 {
				return usagef(cmd, "give exactly one of --server, --client or --peer")
			}
			if o.Node == "" {
				return usagef(cmd, "--node is required: it names the certificate (<node>.%s.%s) and its files", map[bool]string{true: "client", false: "server"}[client], o.Domain)
			}
			if o.Days <= 0 {
				return usagef(cmd, "--days %d: must be positive", o.Days)
			}
			for _, s := range ips {
				ip := net.ParseIP(s)
				if ip == nil {
					return usagef(cmd, "--additional-ipaddress %q is not an IP address", s)
				}
				o.IPs = append(o.IPs, ip)
			}
			var err error
			if o.CA.Cert, err = os.ReadFile(caFile); err != nil {
				return fmt.Errorf("--ca: %w (create one with lodestone tls ca create)", err)
			}
			if o.CA.Key, err = os.ReadFile(keyFile); err != nil {
				return fmt.Errorf("--key: %w", err)
			}
			p, err := tlsutil.CreateCert(o)
			if err != nil {
				return err
			}
			base := filepath.Join(dir, string(o.Kind)+"-"+o.Node)
			if err := tlsutil.WriteFiles(p, base+".pem", base+"-key.pem"); err != nil {
				return err
			}
			dns, ipNames := tlsutil.Names(o.Kind, o.Node, o.Domain)
			names := append(append([]string{}, dns...), o.DNSNames...)
			for _, ip := range append(ipNames, o.IPs...) {
				names = append(names, ip.String())
			}
			fmt.Fprintf(cmd.OutOrStdout(), "==> Using %s and %s\n==> Saved %s.pem\n==> Saved %s-key.pem\n==> Names: %s\n",
				caFile, keyFile, base, base, strings.Join(names, ", "))
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&server, "server", false, "a server certificate (client gRPC and HTTP ports; also fits the peer port)")
	f.BoolVar(&peer, "peer", false, "a peer certificate, for a separate --tls-peer-cert-file")
	f.BoolVar(&client, "client", false, "a client certificate (CLI, agent, gateway)")
	f.StringVar(&caFile, "ca", caCertName, "CA certificate")
	f.StringVar(&keyFile, "key", caKeyName, "CA key")
	f.StringVar(&o.Node, "node", "", "member or client name")
	f.StringVar(&o.Domain, "domain", tlsutil.DefaultDomain, "domain certificate names live under")
	f.StringSliceVar(&o.DNSNames, "additional-dnsname", nil, "more DNS names (repeatable)")
	f.StringSliceVar(&ips, "additional-ipaddress", nil, "more IP addresses (repeatable)")
	f.IntVar(&o.Days, "days", 365, "days the certificate is valid (at most the CA's remaining validity)")
	f.StringVar(&dir, "dir", ".", "directory to write the files to")
	return cmd
}

// reloadOnHUP calls reload on every SIGHUP until ctx ends or stop is
// called. reload logs its own failures; the old material stays in use.
func reloadOnHUP(ctx context.Context, reload func() error) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-hup:
				_ = reload()
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		cancel()
		<-done
	}
}
