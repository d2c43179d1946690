package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/gateway"
)

// gatewayOptions are `lodestone gateway`'s flags.
type gatewayOptions struct {
	cfg            gateway.Config
	registry       []string
	logLevel       string
	logFormat      string
	adminTokenFile string
	tls            gatewayTLSOptions
	configFiles    []string
}

// newGatewayCmd builds `lodestone gateway`: the edge proxy, fed by one
// watch stream to the registry. getenv supplies LODESTONE_GATEWAY_<KEY>.
func newGatewayCmd(getenv func(string) string) *cobra.Command {
	cmd, o := newGatewayFlags()
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := applyConfig(cmd.LocalFlags(), o.configFiles, getenv, gatewayEnvPrefix); err != nil {
			return err
		}
		co, err := clientFlags(cmd)
		if err != nil {
			return err
		}
		if !cmd.Flags().Changed("registry") {
			o.registry = co.Endpoints
		}
		o.cfg.RegistryToken = co.Token
		if o.adminTokenFile != "" {
			if o.cfg.AdminToken, err = readToken(cmd, "--admin-token-file", o.adminTokenFile); err != nil {
				return err
			}
		}
		return runGateway(cmd, o, cmd.OutOrStdout(), cmd.ErrOrStderr())
	}
	return cmd
}

// newGatewayFlags is `lodestone gateway` without its action: its flags,
// bound to the options it returns.
func newGatewayFlags() (*cobra.Command, *gatewayOptions) {
	o := &gatewayOptions{cfg: gateway.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run the edge gateway: routes HTTP to healthy instances from the registry",
		Long: `Run the edge gateway. It routes requests by host and path prefix to services
whose healthy instances it learns from the registry over one watch stream.

Instances (--instances):
  catalog  (default) the catalog's instances whose aggregated health is passing
           (a critical or warning check takes an instance out), registered with
           lodestone catalog register, the Catalog gRPC API or Consul's HTTP API;
           address: the service's, else its node's; meta "protocol": http, h2c
           or https
  kv       JSON values under <prefix>instances/<service>/<id> =
           {"address": "10.0.0.7", "port": 8080, "healthy": true, "meta": {"protocol": "h2c"}}

Routes: KV values <prefix>routes/<name> =
  {"host": "api.example.com", "path_prefix": "/v1/", "service": "api"}
plus static routes from --routes (JSON: {"routes": [{"name": ..., "service": ...}]}).

Every flag is also a key of --config-file (HCL or JSON, repeatable) and an
environment variable LODESTONE_GATEWAY_<KEY>, the flag's name with '_' for
'-': the command line wins over the environment, which wins over the files.

A route or instance change needs no restart. While the registry is down the
gateway serves its last table (persisted under --state-dir for cold starts)
and resumes its watch from the table's index when it returns.
Admin endpoints on --admin: /healthz /readyz /metrics /routes, and the web UI at /ui/.

Try it against lodestone dev:
  lodestone kv put gateway/routes/web '{"path_prefix": "/", "service": "web"}'
  lodestone catalog register web-node --address 127.0.0.1 --service web --port 9000 --check web --status passing
  lodestone gateway --listen 127.0.0.1:9080 --admin 127.0.0.1:9081`,
		Args: cobra.NoArgs,
	}
	c := &o.cfg
	f := cmd.Flags()
	f.StringArrayVar(&o.configFiles, configFileFlag, nil, "HCL (.hcl) or JSON (.json) file of flag values; repeat for more (a later file's key wins)")
	f.StringSliceVar(&o.registry, "registry", nil, "registry gRPC endpoints, comma-separated (default: --endpoints, env "+envEndpoints+")")
	f.StringVar(&c.Listen, "listen", c.Listen, "proxy address")
	f.StringVar(&c.AdminListen, "admin", c.AdminListen, "admin address (/healthz, /readyz, /metrics, /routes, the web UI at /ui/)")
	f.StringVar(&o.adminTokenFile, "admin-token-file", "", "file holding the token /routes requires (default: /routes is open)")
	f.StringVar(&c.RoutesFile, "routes", "", "JSON file of static routes")
	f.StringVar(&c.StateDir, "state-dir", "", "where to persist the last known good table for cold starts (default: none)")
	f.StringVar(&c.Instances, "instances", c.Instances, "where instances come from: catalog or kv (JSON under <prefix>instances/)")
	f.StringVar(&c.KVPrefix, "prefix", c.KVPrefix, "registry KV prefix holding routes/ (and instances/ with --instances kv)")
	f.IntVar(&c.Shards, "shards", c.Shards, "connection-pool shards (a power of two)")
	f.IntVar(&c.SubsetSize, "subset-size", c.SubsetSize, "smallest subset of origins per shard (subsets hold size..2×size)")
	f.IntVar(&c.Replication, "replication", c.Replication, "minimum shards sharing each subset")
	f.IntVar(&c.MaxInFlight, "max-in-flight", c.MaxInFlight, "requests proxied at once before new ones wait")
	f.DurationVar(&c.MaxQueueTime, "max-queue-time", c.MaxQueueTime, "longest wait for a slot before a 503")
	f.IntVar(&c.OriginConcurrency, "origin-concurrency", c.OriginConcurrency, "in-flight requests per origin instance")
	f.DurationVar(&c.ConnectTimeout, "connect-timeout", c.ConnectTimeout, "origin connect (and TLS handshake) timeout, per attempt")
	f.DurationVar(&c.ResponseHeaderTimeout, "response-header-timeout", c.ResponseHeaderTimeout, "wait for an origin's response header, per attempt")
	f.DurationVar(&c.IdleTimeout, "idle-timeout", c.IdleTimeout, "longest silence while streaming a response body")
	f.IntVar(&c.MaxRetries, "max-retries", c.MaxRetries, "retries of idempotent requests without a body (under a 20% budget)")
	addGatewayTLSFlags(f, &o.tls)
	addLogFlags(cmd, &o.logLevel, &o.logFormat)
	return cmd, o
}

// runGateway serves until ctx ends.
func runGateway(cmd *cobra.Command, o *gatewayOptions, stdout, stderr io.Writer) error {
	ctx := cmd.Context()
	logger, err := newLogger(stderr, o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	cfg := o.cfg
	cfg.Registry = o.registry
	cfg.Logger = logger
	gtls, err := o.tls.setup(cmd, &cfg, logger)
	if err != nil {
		return err
	}
	g, err := gateway.New(cfg)
	if err != nil {
		var ce *gateway.ConfigError
		if errors.As(err, &ce) {
			return fmt.Errorf("%w: fix the flag and retry", err)
		}
		return err
	}
	g.Registry().MustRegister(gtls.metrics)
	g.Start()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	sd := newSDNotifier(gatewayReadiness{g}, logger) // systemd Type=notify (sdnotify.go)
	if gtls.front != nil || gtls.admin != nil || gtls.registry != nil {
		// NB: only with TLS: otherwise SIGHUP keeps its default (exit).
		gtls.watch(wctx)
		defer reloadOnHUP(wctx, sd.reloading(gtls.reload))()
	}
	// NB: after SIGHUP is handled: READY=1 allows a reload.
	sd.start(wctx)
	scheme := func(c *tls.Config) string {
		if c != nil {
			return "https"
		}
		return "http"
	}
	fmt.Fprintf(stdout, "lodestone gateway is running\n  proxy:    %s://%s\n  admin:    %s://%s (/healthz, /readyz, /metrics, /routes)\n  registry: %v\n",
		scheme(cfg.FrontTLS), g.Addr(), scheme(cfg.AdminTLS), g.AdminAddr(), cfg.Registry)
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-g.Done():
	}
	sd.stopping()
	if err := g.Close(); err != nil && runErr == nil {
		runErr = fmt.Errorf("shut down: %w", err)
	}
	if runErr == nil && ctx.Err() != nil {
		return nil
	}
	return runErr
}

// errNoRoutingTable is why a gateway is not ready yet.
var errNoRoutingTable = errors.New("no routing table yet (waiting for the registry)")

// gatewayReadiness is a gateway as sdNotifier watches it: ready once it
// has a routing table, as its /readyz; alive while it runs.
type gatewayReadiness struct{ g *gateway.Gateway }

func (r gatewayReadiness) Ready() error {
	if !r.g.Ready() {
		return errNoRoutingTable
	}
	return nil
}

func (gatewayReadiness) Healthy() error { return nil }
