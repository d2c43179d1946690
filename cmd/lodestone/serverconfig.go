package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/internal/member"
	"github.com/lodestone-kv/lodestone/raftnode"
	"github.com/lodestone-kv/lodestone/server"
)

// liveKeys are the keys SIGHUP applies to a running server: the log level
// and server.LiveConfig. A change to any other key is logged as needing a
// restart (docs/configuration.md says why each cannot change live).
var liveKeys = map[string]bool{
	"log_level":                       true,
	"max_key_bytes":                   true,
	"max_value_bytes":                 true,
	"max_txn_ops":                     true,
	"max_range_keys":                  true,
	"max_txn_request_bytes":           true,
	"max_range_response_bytes":        true,
	"max_watches_per_stream":          true,
	"max_watches_per_connection":      true,
	"max_grpc_connections_per_client": true,
	"max_http_connections_per_client": true,
	"connection_limit_exempt":         true,
}

// serverSource is where a server's configuration comes from: the command
// line as given, the environment, and the files the command line names,
// which are read again on every resolve.
type serverSource struct {
	line   commandLine
	getenv func(string) string
}

// resolvedServer is a server's configuration and the flag values it was
// built from.
type resolvedServer struct {
	opts  *serverOptions
	flags *pflag.FlagSet
	cfg   server.Config // not yet validated: server.New does that
	level slog.Level
}

// resolve reads the configuration as it stands now: the defaults, the
// files, the environment, the command line, each over the one before.
func (src serverSource) resolve() (*resolvedServer, error) {
	cmd, o := newServerFlags()
	fs := cmd.Flags()
	if err := src.line.replay(fs); err != nil {
		return nil, err
	}
	if err := applyConfig(fs, o.configFiles, src.getenv, envPrefix); err != nil {
		return nil, err
	}
	if err := finishDNS(cmd, &o.cfg.DNS, &o.dns, "listen-dns"); err != nil {
		return nil, err
	}
	cfg, level, err := o.serverConfig(src.getenv)
	if err != nil {
		return nil, err
	}
	return &resolvedServer{opts: o, flags: fs, cfg: cfg, level: level}, nil
}

// serverConfig builds the server.Config of o, with the checks the flags'
// types cannot make.
func (o *serverOptions) serverConfig(getenv func(string) string) (server.Config, slog.Level, error) {
	cfg := o.cfg
	level, err := parseLogLevel(o.logLevel)
	errs := []error{err}
	if _, err := newLevelLogger(io.Discard, level, o.logFormat); err != nil {
		errs = append(errs, err)
	}
	if o.faultHooks {
		cfg.Faults = &raftnode.Faults{}
		cfg.Faults.SetDiskDelay(o.faultDiskDelay)
	} else if o.faultDiskDelay != 0 {
		errs = append(errs, errors.New("--fault-disk-delay needs --fault-hooks"))
	}
	switch o.aclDefault {
	case "deny":
		cfg.ACL.DefaultPolicy = acl.AccessDeny
	case "allow":
		cfg.ACL.DefaultPolicy = acl.AccessWrite
	default:
		errs = append(errs, fmt.Errorf("--acl-default-policy %q: use deny or allow", o.aclDefault))
	}
	if cfg.InitialCluster, err = member.ParseCluster(o.initialCluster); err != nil {
		errs = append(errs, fmt.Errorf("--initial-cluster: %w", err))
	}
	if len(cfg.InitialCluster) == 0 && !cfg.Join {
		cfg.InitialCluster = map[string]string{cfg.Name: cmp.Or(cfg.AdvertisePeer, cfg.ListenPeer)}
	}
	if err := checkMinProcs(o.minProcs); err != nil {
		errs = append(errs, err)
	}
	if o.heapFloorMiB < 0 {
		errs = append(errs, fmt.Errorf("--gc-heap-floor-mib %d: use 0 (off) or a size in MiB", o.heapFloorMiB))
	}
	gossipKeyFromEnv(&cfg.Gossip.Pool, getenv)
	return cfg, level, errors.Join(errs...)
}

// reloader re-reads a running server's configuration on SIGHUP.
type reloader struct {
	src     serverSource
	started *resolvedServer
	applied map[string]string // flag values by key; the live ones are in force
	level   *slog.LevelVar
	logger  *slog.Logger
	srv     *server.Server
	reloads *prometheus.CounterVec
}

// attach binds rl to the running srv and returns what SIGHUP runs.
func (rl *reloader) attach(srv *server.Server) func() error {
	rl.srv = srv
	rl.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lodestone", Name: "config_reloads_total",
		Help: "Configuration reloads on SIGHUP by result (ok; error: the running configuration stays).",
	}, []string{"result"})
	rl.reloads.WithLabelValues("ok")
	rl.reloads.WithLabelValues("error")
	srv.Registry().MustRegister(rl.reloads)
	return rl.reload
}

// reload applies what changed in the files and environment, then re-reads
// the TLS files (which log and count their own failures).
func (rl *reloader) reload() error {
	err := rl.apply()
	if err != nil {
		rl.logger.Error("configuration not reloaded: the running one stays", "err", oneLine(err.Error()))
		rl.reloads.WithLabelValues("error").Inc()
	} else {
		rl.reloads.WithLabelValues("ok").Inc()
	}
	return errors.Join(err, rl.srv.ReloadTLS())
}

func (rl *reloader) apply() error {
	next, err := rl.src.resolve()
	if err != nil {
		return err
	}
	if err := next.cfg.Validate(); err != nil {
		return err
	}
	values, started := flagValues(next.flags), flagValues(rl.started.flags)
	changed := []string{}
	for _, key := range slices.Sorted(maps.Keys(values)) {
		switch {
		case liveKeys[key] && values[key] != rl.applied[key]:
			changed = append(changed, key+"="+values[key])
		case !liveKeys[key] && values[key] != started[key]:
			// NB: the key alone: a value may be a secret (gossip_encrypt).
			rl.logger.Warn("configuration key changed, but it takes a restart: the running value stays", "key", key)
		}
	}
	if err := rl.srv.Reload(next.cfg.Live()); err != nil {
		return err
	}
	rl.level.Set(next.level)
	rl.applied = values
	rl.logger.Info("configuration reloaded", "changed", changed)
	return nil
}

func newValidateConfigCmd() *cobra.Command {
	var forGateway bool
	cmd := &cobra.Command{
		Use:   "validate-config FILE...",
		Short: "Check server (or gateway) configuration files without starting anything",
		Long: `Check configuration files as 'lodestone server --config-file FILE...' reads
them, without flags or environment: their syntax, keys and value types, then
what the server checks before it starts (its name and addresses,
initial_cluster, acl_default_policy, log_level, TLS files readable and
matching their CA). With --gateway, as 'lodestone gateway --config-file'
reads them, with the gateway's checks. It binds no port and writes nothing.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef(cmd, "want FILE...")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, files []string) error {
			validate := validateServerConfig
			if forGateway {
				validate = validateGatewayConfig
			}
			problems := validate(files)
			names := strings.Join(files, ", ")
			if len(problems) == 0 {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s: valid\n", names)
				return err
			}
			for _, p := range problems {
				fmt.Fprintln(cmd.ErrOrStderr(), oneLine(p.Error()))
			}
			plural := "s"
			if len(problems) == 1 {
				plural = ""
			}
			return fmt.Errorf("%s: not valid (%d problem%s above)", names, len(problems), plural)
		},
	}
	cmd.Flags().BoolVar(&forGateway, "gateway", false, "the files are for lodestone gateway")
	return cmd
}

// validateServerConfig lists what is wrong with files, as a server given
// them alone would find it.
// validateGatewayConfig checks gateway files: keys and types, the log
// settings, then the gateway's own configuration checks.
func validateGatewayConfig(files []string) []error {
	cmd, o := newGatewayFlags()
	if err := applyConfig(cmd.Flags(), files, func(string) string { return "" }, gatewayEnvPrefix); err != nil {
		return unjoin(err)
	}
	if _, err := newLogger(io.Discard, o.logLevel, o.logFormat); err != nil {
		return []error{err}
	}
	cfg := o.cfg
	cfg.Registry = o.registry
	return unjoin(cfg.Validate())
}

func validateServerConfig(files []string) []error {
	src := serverSource{line: commandLine{{name: configFileFlag, values: files}}, getenv: func(string) string { return "" }}
	r, err := src.resolve()
	if err == nil {
		err = r.cfg.Validate()
	}
	if err == nil {
		err = r.cfg.CheckTLSFiles()
	}
	return unjoin(err)
}

// unjoin lists the errors errors.Join put together.
func unjoin(err error) []error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		if err == nil {
			return nil
		}
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, unjoin(e)...)
	}
	return out
}
