package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/gateway"
	"github.com/lodestone-kv/lodestone/gateway/demo"
	"github.com/lodestone-kv/lodestone/server"
)

type devOptions struct {
	dataDir      string
	grpcAddr     string
	httpAddr     string
	peerAddr     string
	gatewayAddr  string
	gatewayAdmin string
	noGateway    bool
	dnsAddr      string
	dnsOptional  bool
	holdTimeout  time.Duration
	logLevel     string
	logFormat    string
}

func newDevCmd() *cobra.Command {
	o := &devOptions{}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a single-node registry with a gateway in front of a demo service",
		Long: `Run everything a newcomer needs in one process: a single-node registry, an
edge gateway fed by it, and a small demo service (two instances) behind the
gateway, registered in the catalog (node dev-demo). Try:
  curl http://127.0.0.1:8080/            # answered by demo-1 or demo-2
  curl http://127.0.0.1:8081/routes      # the gateway's routing table
  lodestone health service demo          # the demo instances and their checks
  lodestone kv put greeting hello && lodestone kv get greeting`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.dnsOptional = !cmd.Flags().Changed("dns")
			return runDev(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data-dir", filepath.Join(os.TempDir(), "lodestone-dev"), "where the dev node keeps its data")
	f.StringVar(&o.grpcAddr, "grpc", "127.0.0.1:7400", "client gRPC address")
	f.StringVar(&o.httpAddr, "http", "127.0.0.1:8500", "HTTP address (Consul API, /metrics, /healthz, /readyz)")
	f.StringVar(&o.peerAddr, "peer", "127.0.0.1:7401", "Raft peer address")
	f.StringVar(&o.gatewayAddr, "gateway", "127.0.0.1:8080", "gateway proxy address")
	f.StringVar(&o.gatewayAdmin, "gateway-admin", "127.0.0.1:8081", "gateway admin address (/healthz, /readyz, /metrics, /routes)")
	f.BoolVar(&o.noGateway, "no-gateway", false, "run the registry alone, without the gateway and demo service")
	f.StringVar(&o.dnsAddr, "dns", defaultDNSAddr, "DNS address, UDP and TCP (Consul's DNS interface; \"\": off; the default is skipped with a warning when taken)")
	addHoldFlag(cmd, &o.holdTimeout)
	addLogFlags(cmd, &o.logLevel, &o.logFormat)
	return cmd
}

func runDev(ctx context.Context, o *devOptions, stdout, stderr io.Writer) error {
	logger, err := newLogger(stderr, o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	cfg := server.DefaultConfig()
	cfg.Name = "dev"
	cfg.DataDir = o.dataDir
	cfg.ListenGRPC, cfg.ListenHTTP, cfg.ListenPeer = o.grpcAddr, o.httpAddr, o.peerAddr
	cfg.InitialCluster = map[string]string{"dev": o.peerAddr}
	cfg.Logger = logger
	cfg.RPCHoldTimeout = o.holdTimeout
	cfg.DNS.Listen, cfg.DNS.ListenOptional = o.dnsAddr, o.dnsOptional
	return serveUntilDone(ctx, cfg, func(ctx context.Context, s *server.Server) error {
		fmt.Fprintf(stdout, "lodestone dev is running\n  grpc:    %s\n  http:    http://%s (Consul API, /metrics, /healthz, /readyz)\n  ui:      http://%s/ui/\n",
			s.GRPCAddr(), s.HTTPAddr(), s.HTTPAddr())
		if a := s.DNSAddr(); a != "" {
			host, port, _ := net.SplitHostPort(a)
			fmt.Fprintf(stdout, "  dns:     %s (dig @%s -p %s demo.service.consul SRV)\n", a, host, port)
		}
		fmt.Fprintf(stdout, "  data:    %s\n", o.dataDir)
		if o.noGateway {
			fmt.Fprintln(stdout, "try: lodestone kv put greeting hello && lodestone kv get greeting")
			<-ctx.Done()
			return nil
		}
		return runDevGateway(ctx, o, s.GRPCAddr(), logger.With("component", "gateway"), stdout)
	})
}

// runDevGateway serves the demo service behind a gateway fed by the dev
// registry at grpcAddr until ctx ends.
func runDevGateway(ctx context.Context, o *devOptions, grpcAddr string, logger *slog.Logger, stdout io.Writer) error {
	ccfg := client.DefaultConfig()
	ccfg.Endpoints = []string{grpcAddr}
	c, err := client.New(ccfg)
	if err != nil {
		return fmt.Errorf("gateway's registry client: %w", err)
	}
	gcfg := gateway.DevConfig()
	gcfg.Listen, gcfg.AdminListen = o.gatewayAddr, o.gatewayAdmin
	err = demo.Run(ctx, demo.Config{
		Client:  c,
		Gateway: gcfg,
		Logger:  logger,
		Ready: func(proxy, admin string, instances []string) {
			fmt.Fprintf(stdout, "  gateway: http://%s (demo service %q on %v)\n  admin:   http://%s (/ui/, /healthz, /readyz, /metrics, /routes)\ntry: curl http://%s/ && lodestone kv put greeting hello && lodestone kv get greeting\n",
				proxy, demo.Service, instances, admin, proxy)
		},
	})
	return errors.Join(err, c.Close())
}
