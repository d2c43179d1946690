package main

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

func newHealthCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Show the health of service instances and checks",
		Long: `Show the health of service instances and checks (Consul's /v1/health).
An instance is critical if any of its checks (its own and its node's) is
critical, else warning if any is warning, else passing.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(newHealthServiceCmd(), newHealthNodeCmd(), newHealthStateCmd(), newHealthChecksCmd())
	return cmd
}

// jsonCheck is a check as -o json prints it.
type jsonCheck struct {
	Node      string `json:"node"`
	CheckID   string `json:"check_id"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	ServiceID string `json:"service_id,omitempty"`
	Output    string `json:"output,omitempty"`
}

func toJSONCheck(c *lodestonepb.Check) jsonCheck {
	return jsonCheck{Node: c.GetNode(), CheckID: c.GetCheckId(), Name: c.GetName(), Status: healthName(c.GetStatus()),
		ServiceID: c.GetServiceId(), Output: c.GetOutput()}
}

func newHealthServiceCmd() *cobra.Command {
	var f client.HealthFilter
	cmd := readCmd("service NAME [--passing] [--tag T]...", "List a service's instances with their health", exactArgs("NAME"),
		func(ctx context.Context, o clientOptions, format string, args []string, w io.Writer) error {
			return withClient(ctx, o, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Health(ctx, args[0], f)
				if err != nil {
					return explain(err, o, "")
				}
				return renderHealth(w, format, resp.GetInstances())
			})
		})
	cmd.Flags().BoolVar(&f.PassingOnly, "passing", false, "only instances whose checks all pass")
	cmd.Flags().StringArrayVar(&f.Tags, "tag", nil, "only instances with this tag (repeatable: all of them)")
	return cmd
}

func renderHealth(w io.Writer, format string, hs []*lodestonepb.ServiceHealth) error {
	if format == outputJSON {
		type entry struct {
			Node    jsonNode    `json:"node"`
			Service jsonService `json:"service"`
			Status  string      `json:"status"`
			Checks  []jsonCheck `json:"checks"`
		}
		out := make([]entry, 0, len(hs))
		for _, h := range hs {
			e := entry{Node: toJSONNode(h.GetNode()), Service: toJSONService(h.GetService()), Status: healthName(h.GetStatus()), Checks: []jsonCheck{}}
			for _, c := range h.GetChecks() {
				e.Checks = append(e.Checks, toJSONCheck(c))
			}
			out = append(out, e)
		}
		return writeJSON(w, out)
	}
	tw := newTable(w)
	tw.row("NODE", "ADDRESS", "SERVICE-ID", "PORT", "STATUS", "CHECKS")
	for _, h := range hs {
		addr := h.GetService().GetAddress()
		if addr == "" {
			addr = h.GetNode().GetAddress()
		}
		tw.row(h.GetNode().GetName(), addr, h.GetService().GetId(), h.GetService().GetPort(), healthName(h.GetStatus()), len(h.GetChecks()))
	}
	return tw.flush()
}

func renderChecks(w io.Writer, format string, cs []*lodestonepb.Check) error {
	if format == outputJSON {
		out := make([]jsonCheck, 0, len(cs))
		for _, c := range cs {
			out = append(out, toJSONCheck(c))
		}
		return writeJSON(w, out)
	}
	tw := newTable(w)
	tw.row("NODE", "CHECK", "SERVICE-ID", "STATUS", "OUTPUT")
	for _, c := range cs {
		tw.row(c.GetNode(), c.GetCheckId(), dash(c.GetServiceId()), healthName(c.GetStatus()), dash(oneLine(c.GetOutput())))
	}
	return tw.flush()
}

func newHealthNodeCmd() *cobra.Command {
	cmd := readCmd("node NAME", "List a node's checks", exactArgs("NAME"),
		func(ctx context.Context, o clientOptions, format string, args []string, w io.Writer) error {
			return withClient(ctx, o, func(ctx context.Context, c *client.Client) error {
				resp, err := c.NodeChecks(ctx, args[0])
				if err != nil {
					return explain(err, o, "")
				}
				return renderChecks(w, format, resp.GetChecks())
			})
		})
	return cmd
}

func newHealthChecksCmd() *cobra.Command {
	cmd := readCmd("checks SERVICE", "List the checks of a service's instances", exactArgs("SERVICE"),
		func(ctx context.Context, o clientOptions, format string, args []string, w io.Writer) error {
			return withClient(ctx, o, func(ctx context.Context, c *client.Client) error {
				resp, err := c.ServiceChecks(ctx, args[0])
				if err != nil {
					return explain(err, o, "")
				}
				return renderChecks(w, format, resp.GetChecks())
			})
		})
	return cmd
}

func newHealthStateCmd() *cobra.Command {
	cmd := readCmd("state any|passing|warning|critical", "List the checks in a state", exactArgs("STATE"),
		func(ctx context.Context, o clientOptions, format string, args []string, w io.Writer) error {
			st := lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED
			if args[0] != "any" {
				var err error
				if st, err = lodestonepb.ParseHealthStatus(args[0]); err != nil || st == lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED {
					return &usageError{cmd: "lodestone health state", msg: "state " + args[0] + ": use any, passing, warning or critical"}
				}
			}
			return withClient(ctx, o, func(ctx context.Context, c *client.Client) error {
				resp, err := c.ChecksInState(ctx, st)
				if err != nil {
					return explain(err, o, "")
				}
				return renderChecks(w, format, resp.GetChecks())
			})
		})
	return cmd
}
