package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/server"
)

type devOptions struct {
	dataDir   string
	grpcAddr  string
	httpAddr  string
	peerAddr  string
	logLevel  string
	logFormat string
}

func newDevCmd() *cobra.Command {
	o := &devOptions{}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a single-node registry for development",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDev(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data-dir", filepath.Join(os.TempDir(), "lodestone-dev"), "where the dev node keeps its data")
	f.StringVar(&o.grpcAddr, "grpc", "127.0.0.1:7400", "client gRPC address")
	f.StringVar(&o.httpAddr, "http", "127.0.0.1:8500", "HTTP address (/metrics, /healthz, /readyz)")
	f.StringVar(&o.peerAddr, "peer", "127.0.0.1:7401", "Raft peer address")
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
	return serveUntilDone(ctx, cfg, func(s *server.Server) {
		fmt.Fprintf(stdout, "lodestone dev is running\n  grpc:    %s\n  http:    http://%s (/metrics, /healthz, /readyz)\n  data:    %s\ntry: lodestone kv put greeting hello && lodestone kv get greeting\n",
			s.GRPCAddr(), s.HTTPAddr(), o.dataDir)
	})
}
