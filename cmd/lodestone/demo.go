package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/gateway/demo"
)

type demoOptions struct {
	listen    string
	name      string
	logLevel  string
	logFormat string
}

// newDemoCmd builds `lodestone demo`: one instance of the demo service
// `lodestone dev` runs, on its own, for a container beside an agent.
func newDemoCmd() *cobra.Command {
	o := &demoOptions{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Serve one instance of the demo HTTP service (what lodestone dev puts behind its gateway)",
		Long: `Serve one instance of the demo HTTP service on --listen. It answers
  GET /            JSON naming the instance (--name), the path and the headers a gateway added
  GET /health      ok (for an agent's HTTP check; also /healthz)
  GET /slow?ms=N, /status/N, /stream?n=N   to try a gateway's timeouts, retries and streaming
It registers nothing: run an agent beside it with a service definition, e.g.
  {"services": [{"Name": "demo", "Port": 9000,
    "Check": {"HTTP": "http://127.0.0.1:9000/health", "Interval": "1s"}}]}`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "127.0.0.1:9000", "address to serve on")
	f.StringVar(&o.name, "name", "demo", "instance name the answers carry")
	addLogFlags(cmd, &o.logLevel, &o.logFormat)
	return cmd
}

func runDemo(ctx context.Context, o *demoOptions, stdout, stderr io.Writer) error {
	logger, err := newLogger(stderr, o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	if o.name == "" {
		return errors.New("--name is empty: give the instance a name its answers can carry")
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", o.listen, err)
	}
	srv := &http.Server{Handler: demo.Handler(o.name), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.Info("demo service serving", "addr", ln.Addr().String(), "instance", o.name)
	fmt.Fprintf(stdout, "lodestone demo is running: http://%s (instance %s)\n", ln.Addr(), o.name)
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// NB: long /slow and /stream answers get a few seconds to finish.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	<-served
	if err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	logger.Info("demo service stopped", "instance", o.name)
	return nil
}
