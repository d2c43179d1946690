package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lodestone-kv/lodestone/agent"
	"github.com/lodestone-kv/lodestone/gossip"
)

type agentOptions struct {
	cfg        agent.Config
	configFile string
	logLevel   string
	logFormat  string
}

func newAgentCmd() *cobra.Command {
	o := &agentOptions{cfg: agent.DefaultConfig()}
	host, _ := os.Hostname()
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run beside services: register them, run their health checks, gossip liveness",
		Long: `Run an agent beside services. It joins the gossip pool (--gossip-join, any
server or agent), registers the services of --config-file and those
registered on its local Consul-compatible API (/v1/agent/service/register,
/v1/agent/check/pass|warn|fail/:id), runs their HTTP, TCP, gRPC, TTL (and,
with --enable-script-checks, script) checks and
writes only status changes to the registry (--endpoints). If the agent dies,
the leader marks its node critical within the gossip detection time.

--config-file is JSON: {"services": [{"Name": "web", "Port": 8080,
  "Check": {"HTTP": "http://127.0.0.1:8080/health", "Interval": "10s"}}]}`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			co, err := clientFlags(cmd)
			if err != nil {
				return err
			}
			o.cfg.Endpoints, o.cfg.Token, o.cfg.TLS = co.Endpoints, co.Token, co.TLS
			return runAgent(cmd.Context(), o, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.cfg.NodeName, "node", host, "catalog node and gossip member name (unique)")
	f.StringVar(&o.cfg.Address, "address", "", "the node's address in the catalog (default: the gossip address's host)")
	f.StringVar(&o.configFile, "config-file", "", `JSON file with {"services": [...]} to register at start`)
	f.StringVar(&o.cfg.ListenHTTP, "listen-http", "127.0.0.1:8510", "address of the local agent API and /metrics (empty: off)")
	f.StringVar(&o.cfg.OnStop, "on-stop", o.cfg.OnStop, "on SIGINT/SIGTERM: leave (the node stays, marked critical) or deregister (the node is removed)")
	f.DurationVar(&o.cfg.AntiEntropyInterval, "anti-entropy-interval", o.cfg.AntiEntropyInterval, "how often the node is read back from the registry to repair differences")
	f.BoolVar(&o.cfg.EnableScriptChecks, "enable-script-checks", false, "run script checks (Args) registered through the local API too (anyone who reaches it can then run commands as the agent)")
	f.BoolVar(&o.cfg.EnableLocalScriptChecks, "enable-local-script-checks", false, "run script checks (Args) of --config-file services")
	addGossipFlags(f, &o.cfg.Gossip, "127.0.0.1:7946")
	addLogFlags(cmd, &o.logLevel, &o.logFormat)
	return cmd
}

// addGossipFlags exposes the gossip settings servers and agents share.
// An empty listen default means gossip is off unless --gossip-listen is
// given.
func addGossipFlags(f *pflag.FlagSet, cfg *gossip.Config, listen string) {
	cfg.BindAddr = listen
	f.StringVar(&cfg.BindAddr, "gossip-listen", listen, "host:port for gossip (UDP and TCP)")
	f.StringVar(&cfg.AdvertiseAddr, "gossip-advertise", "", "host:port other members reach this one at (default: --gossip-listen)")
	f.StringSliceVar(&cfg.Join, "gossip-join", nil, "gossip addresses of existing members to join, comma-separated")
	f.StringVar(&cfg.EncryptKey, "gossip-encrypt", "", "base64 AES key (16, 24 or 32 bytes) shared by every member; env LODESTONE_GOSSIP_KEY")
	f.DurationVar(&cfg.ProbeInterval, "gossip-probe-interval", cfg.ProbeInterval, "how often a random member is probed (lower: faster failure detection, more packets)")
	f.DurationVar(&cfg.ProbeTimeout, "gossip-probe-timeout", cfg.ProbeTimeout, "how long a probe waits for its ack")
	f.IntVar(&cfg.SuspicionMult, "gossip-suspicion-mult", cfg.SuspicionMult, "suspicion time in probe intervals before a member is declared failed")
	f.IntVar(&cfg.SuspicionMaxTimeoutMult, "gossip-suspicion-max-mult", cfg.SuspicionMaxTimeoutMult, "cap on the suspicion time while confirmations are missing, as a multiple")
	f.DurationVar(&cfg.GossipInterval, "gossip-interval", cfg.GossipInterval, "how often state changes are gossiped")
}

// gossipKeyFromEnv fills an empty --gossip-encrypt from the environment,
// so the key need not appear in process listings.
func gossipKeyFromEnv(cfg *gossip.Config, getenv func(string) string) {
	if cfg.EncryptKey == "" {
		cfg.EncryptKey = getenv("LODESTONE_GOSSIP_KEY")
	}
}

func runAgent(ctx context.Context, o *agentOptions, stderr io.Writer) error {
	logger, err := newLogger(stderr, o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	cfg := o.cfg
	cfg.Logger = logger
	gossipKeyFromEnv(&cfg.Gossip, os.Getenv)
	if o.configFile != "" {
		file, err := agent.LoadFile(o.configFile)
		if err != nil {
			return fmt.Errorf("--config-file: %w", err)
		}
		cfg.Services = file.Services
	}
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	a.Start()
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Close(cctx); err != nil {
		return fmt.Errorf("stop agent: %w", err)
	}
	return nil
}
