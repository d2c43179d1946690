package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

func newAdmissionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "admission",
		Short: "Limit the client requests every server admits (set, off, show)",
		Long: `Admission control lets clients back in gradually after an outage. The policy
is replicated, so every server enforces it: over a limit a request is refused
at once with RESOURCE_EXHAUSTED (HTTP 429 on the Consul API) and a retry-after,
which the Go client honours with jittered backoff. A connection limit paces
new client gRPC connections instead: they wait in the listen backlog for their
turn. Admin, cluster, health and metrics requests are never limited.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(newAdmissionSetCmd(), newAdmissionOffCmd(), newAdmissionShowCmd())
	return cmd
}

type admissionSetOptions struct {
	Reads, Writes, Watches, Connections uint64
	Ramp                                string
}

func newAdmissionSetCmd() *cobra.Command {
	var o admissionSetOptions
	cmd := &cobra.Command{
		Use:   "set [--reads R] [--writes W] [--watches C] [--connections N] [--ramp PERCENT/MIN]",
		Short: "Set per-server limits (requests per second; 0 leaves a class unlimited)",
		Long: `Set replaces the admission policy. --reads and --writes are requests per second
per server, --watches new watch streams (and blocking queries) per second per
server; 0 leaves that class unlimited. --connections paces new client gRPC
connections per second per server: the ones over it are not refused but wait
in the kernel's listen backlog, before their TLS handshake, so a fleet
reconnecting at once does not crowd out the servers' commits (an operator's
own connection waits its turn too). With --ramp 10/min the limits start at
10% and rise by 10% each minute until they reach 100%; a server that restarts
ramps up again from its own start.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			co, err := clientFlags(cmd)
			if err != nil {
				return err
			}
			if o.Reads == 0 && o.Writes == 0 && o.Watches == 0 && o.Connections == 0 {
				return usagef(cmd, "give at least one of --reads, --writes, --watches, --connections (or use 'admission off')")
			}
			ramp, err := parseRamp(o.Ramp)
			if err != nil {
				return usagef(cmd, "--ramp %q: %v", o.Ramp, err)
			}
			p := &lodestonepb.AdmissionPolicy{Enabled: true, Reads: o.Reads, Writes: o.Writes, Watches: o.Watches, Connections: o.Connections, RampPercentPerMin: ramp}
			return setAdmission(cmd.Context(), co, p, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.Uint64Var(&o.Reads, "reads", 0, "reads per second per server (0: unlimited)")
	f.Uint64Var(&o.Writes, "writes", 0, "writes per second per server (0: unlimited)")
	f.Uint64Var(&o.Watches, "watches", 0, "new watch streams per second per server (0: unlimited)")
	f.Uint64Var(&o.Connections, "connections", 0, "new client gRPC connections accepted per second per server; the rest wait (0: unlimited)")
	f.StringVar(&o.Ramp, "ramp", "", "start at PERCENT of the limits and add PERCENT each minute, e.g. 10/min")
	return cmd
}

// parseRamp reads "10/min", "10%/min" or "10"; "" means no ramp.
func parseRamp(s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	num := strings.TrimSuffix(strings.TrimSuffix(s, "/min"), "%")
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 || v > 100 {
		return 0, fmt.Errorf("want PERCENT/MIN with PERCENT in (0, 100], e.g. 10/min")
	}
	return v, nil
}

func newAdmissionOffCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "off",
		Short: "Turn admission control off on every server",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			co, err := clientFlags(cmd)
			if err != nil {
				return err
			}
			return setAdmission(cmd.Context(), co, &lodestonepb.AdmissionPolicy{}, cmd.OutOrStdout())
		},
	}
}

func setAdmission(ctx context.Context, co clientOptions, p *lodestonepb.AdmissionPolicy, w io.Writer) error {
	return withClient(ctx, co, func(ctx context.Context, c *client.Client) error {
		resp, err := c.SetAdmission(ctx, p)
		if err != nil {
			return explain(err, co, "")
		}
		_, err = fmt.Fprintf(w, "%s (index %d)\n", describePolicy(resp.GetPolicy(), -1), resp.GetIndex())
		return err
	})
}

func newAdmissionShowCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Show the admission policy in force",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			co, err := clientFlags(cmd)
			if err != nil {
				return err
			}
			if err := checkOutput(cmd, output); err != nil {
				return err
			}
			return withClient(cmd.Context(), co, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Admission(ctx)
				if err != nil {
					return explain(err, co, "")
				}
				if output == outputJSON {
					p := resp.GetPolicy()
					return writeJSON(cmd.OutOrStdout(), map[string]any{
						"enabled": p.GetEnabled(), "reads": p.GetReads(), "writes": p.GetWrites(), "watches": p.GetWatches(), "connections": p.GetConnections(),
						"ramp_percent_per_min": p.GetRampPercentPerMin(), "current_percent": resp.GetCurrentPercent(),
					})
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), describePolicy(resp.GetPolicy(), resp.GetCurrentPercent()))
				return err
			})
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// describePolicy renders a policy on one line; current < 0 omits the ramp
// position.
func describePolicy(p *lodestonepb.AdmissionPolicy, current float64) string {
	if !p.GetEnabled() {
		return "admission control is off"
	}
	lim := func(v uint64) string {
		if v == 0 {
			return "unlimited"
		}
		return fmt.Sprintf("%d/s", v)
	}
	s := fmt.Sprintf("admission control is on: reads %s, writes %s, watches %s", lim(p.GetReads()), lim(p.GetWrites()), lim(p.GetWatches()))
	if n := p.GetConnections(); n > 0 {
		s += fmt.Sprintf(", new connections %d/s", n)
	}
	s += " per server"
	if r := p.GetRampPercentPerMin(); r > 0 {
		s += fmt.Sprintf(", ramping %g%%/min", r)
		if current >= 0 {
			s += fmt.Sprintf(" (now at %.0f%%)", current)
		}
	}
	return s
}
