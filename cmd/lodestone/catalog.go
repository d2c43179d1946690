package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/server"
)

func newCatalogCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "catalog",
		Short: "List, register and deregister nodes and services",
		Long: `List, register and deregister catalog nodes and services (Consul's
/v1/catalog). Health of the instances: 'lodestone health'.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(newCatalogServicesCmd(), newCatalogNodesCmd(), newCatalogNodeCmd(),
		newCatalogRegisterCmd(), newCatalogDeregisterCmd())
	return cmd
}

// jsonService is a service instance as -o json prints it.
type jsonService struct {
	ID      string            `json:"id"`
	Name    string            `json:"name"`
	Node    string            `json:"node"`
	Address string            `json:"address"`
	Port    uint32            `json:"port"`
	Tags    []string          `json:"tags"`
	Meta    map[string]string `json:"meta,omitempty"`
}

func toJSONService(s *lodestonepb.Service) jsonService {
	return jsonService{ID: s.GetId(), Name: s.GetName(), Node: s.GetNode(), Address: s.GetAddress(), Port: s.GetPort(),
		Tags: nonNilStrings(s.GetTags()), Meta: s.GetMeta()}
}

// jsonNode is a node as -o json prints it.
type jsonNode struct {
	Name    string            `json:"name"`
	ID      string            `json:"id,omitempty"`
	Address string            `json:"address"`
	Meta    map[string]string `json:"meta,omitempty"`
}

func toJSONNode(n *lodestonepb.Node) jsonNode {
	return jsonNode{Name: n.GetName(), ID: n.GetId(), Address: n.GetAddress(), Meta: n.GetMeta()}
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func joinOrDash(s []string) string { return dash(strings.Join(s, ",")) }

// readCmd builds a read command with the client flags and -o: run gets
// the parsed options and the positional arguments.
func readCmd(use, short string, args cobra.PositionalArgs, run func(context.Context, clientOptions, string, []string, io.Writer) error) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  args,
		RunE: func(cmd *cobra.Command, a []string) error {
			co, err := clientFlags(cmd)
			if err != nil {
				return err
			}
			if err := checkOutput(cmd, output); err != nil {
				return err
			}
			return run(cmd.Context(), co, output, a, cmd.OutOrStdout())
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func newCatalogServicesCmd() *cobra.Command {
	cmd := readCmd("services", "List service names with their tags", noArgs,
		func(ctx context.Context, o clientOptions, format string, _ []string, w io.Writer) error {
			return withClient(ctx, o, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Services(ctx)
				if err != nil {
					return explain(err, o, "")
				}
				return renderServices(w, format, resp.GetServices())
			})
		})
	return cmd
}

func renderServices(w io.Writer, format string, svcs []*lodestonepb.ServiceSummary) error {
	if format == outputJSON {
		out := map[string][]string{}
		for _, s := range svcs {
			out[s.GetName()] = nonNilStrings(s.GetTags())
		}
		return writeJSON(w, out)
	}
	tw := newTable(w)
	tw.row("SERVICE", "TAGS")
	for _, s := range svcs {
		tw.row(s.GetName(), joinOrDash(s.GetTags()))
	}
	return tw.flush()
}

func newCatalogNodesCmd() *cobra.Command {
	cmd := readCmd("nodes", "List nodes", noArgs,
		func(ctx context.Context, o clientOptions, format string, _ []string, w io.Writer) error {
			return withClient(ctx, o, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Nodes(ctx)
				if err != nil {
					return explain(err, o, "")
				}
				return renderNodes(w, format, resp.GetNodes())
			})
		})
	return cmd
}

func renderNodes(w io.Writer, format string, nodes []*lodestonepb.Node) error {
	if format == outputJSON {
		out := make([]jsonNode, 0, len(nodes))
		for _, n := range nodes {
			out = append(out, toJSONNode(n))
		}
		return writeJSON(w, out)
	}
	tw := newTable(w)
	tw.row("NODE", "ADDRESS", "ID")
	for _, n := range nodes {
		tw.row(n.GetName(), n.GetAddress(), dash(n.GetId()))
	}
	return tw.flush()
}

func newCatalogNodeCmd() *cobra.Command {
	cmd := readCmd("node NAME", "Show a node and its services", exactArgs("NAME"),
		func(ctx context.Context, o clientOptions, format string, args []string, w io.Writer) error {
			return withClient(ctx, o, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Node(ctx, args[0])
				if err != nil {
					return explain(err, o, "")
				}
				if resp.GetNode() == nil {
					return fmt.Errorf("node %q is not registered: list the nodes with 'lodestone catalog nodes'", args[0])
				}
				return renderNode(w, format, resp.GetNode())
			})
		})
	return cmd
}

func renderNode(w io.Writer, format string, ns *lodestonepb.NodeServices) error {
	if format == outputJSON {
		out := struct {
			Node     jsonNode      `json:"node"`
			Services []jsonService `json:"services"`
		}{Node: toJSONNode(ns.GetNode()), Services: []jsonService{}}
		for _, s := range ns.GetServices() {
			out.Services = append(out.Services, toJSONService(s))
		}
		return writeJSON(w, out)
	}
	if _, err := fmt.Fprintf(w, "node %s at %s\n", ns.GetNode().GetName(), ns.GetNode().GetAddress()); err != nil {
		return err
	}
	tw := newTable(w)
	tw.row("SERVICE-ID", "SERVICE", "ADDRESS", "PORT", "TAGS")
	for _, s := range ns.GetServices() {
		tw.row(s.GetId(), s.GetName(), dash(s.GetAddress()), s.GetPort(), joinOrDash(s.GetTags()))
	}
	return tw.flush()
}

// ---- catalog register / deregister ----

type catalogRegisterOptions struct {
	Client    clientOptions
	Node      string
	Address   string
	Service   string
	ServiceID string
	Port      uint32
	Tags      []string
	CheckID   string
	Status    string
}

func newCatalogRegisterCmd() *cobra.Command {
	var o catalogRegisterOptions
	cmd := &cobra.Command{
		Use:   "register NODE --address ADDR [--service NAME [--id ID] [--port N] [--tag T]...] [--check ID --status S]",
		Short: "Register (or update) a node, optionally with a service and a check",
		Args:  exactArgs("NODE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Client, err = clientFlags(cmd); err != nil {
				return err
			}
			o.Node = args[0]
			if o.Address == "" {
				return usagef(cmd, "--address is required: the node's address")
			}
			if o.Service == "" && (o.ServiceID != "" || o.Port != 0 || len(o.Tags) > 0) {
				return usagef(cmd, "--id, --port and --tag describe a service: add --service NAME")
			}
			if _, err := lodestonepb.ParseHealthStatus(o.Status); err != nil {
				return usagef(cmd, "%v", err)
			}
			return runCatalogRegister(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Address, "address", "", "the node's address (required)")
	f.StringVar(&o.Service, "service", "", "register a service instance with this name")
	f.StringVar(&o.ServiceID, "id", "", "the instance's id (default: the service name)")
	f.Uint32Var(&o.Port, "port", 0, "the instance's port")
	f.StringArrayVar(&o.Tags, "tag", nil, "a tag of the instance (repeatable)")
	f.StringVar(&o.CheckID, "check", "", "register a check with this id (on the service when --service is given)")
	f.StringVar(&o.Status, "status", "passing", "the check's status: passing, warning or critical")
	return cmd
}

// healthName is a status as tables print it.
func healthName(s lodestonepb.HealthStatus) string { return dash(lodestonepb.HealthStatusWord(s)) }

func runCatalogRegister(ctx context.Context, o catalogRegisterOptions, w io.Writer) error {
	req := &lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: o.Node, Address: o.Address}}
	if o.Service != "" {
		req.Service = &lodestonepb.Service{Id: o.ServiceID, Name: o.Service, Port: o.Port, Tags: o.Tags}
	}
	if o.CheckID != "" {
		st, _ := lodestonepb.ParseHealthStatus(o.Status)
		ch := &lodestonepb.Check{CheckId: o.CheckID, Name: o.CheckID, Status: st, Node: o.Node}
		if o.Service != "" {
			ch.ServiceId = o.ServiceID
			if ch.ServiceId == "" {
				ch.ServiceId = o.Service
			}
		}
		req.Checks = append(req.Checks, ch)
	}
	return withClient(ctx, o.Client, func(ctx context.Context, c *client.Client) error {
		resp, err := c.Register(ctx, req)
		if err != nil {
			return explain(err, o.Client, "fix what the message names and retry")
		}
		what := "node " + o.Node
		if o.Service != "" {
			what += ", service " + o.Service
		}
		if o.CheckID != "" {
			what += ", check " + o.CheckID
		}
		_, err = fmt.Fprintf(w, "registered %s at index %d\n", what, resp.GetHeader().GetIndex())
		return err
	})
}

type catalogDeregisterOptions struct {
	Client    clientOptions
	Node      string
	ServiceID string
	CheckID   string
}

func newCatalogDeregisterCmd() *cobra.Command {
	var o catalogDeregisterOptions
	cmd := &cobra.Command{
		Use:   "deregister NODE [--service ID] [--check ID]",
		Short: "Remove a node (with everything on it), a service or a check",
		Args:  exactArgs("NODE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Client, err = clientFlags(cmd); err != nil {
				return err
			}
			o.Node = args[0]
			return withClient(cmd.Context(), o.Client, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Deregister(ctx, o.Node, o.ServiceID, o.CheckID)
				if err != nil {
					return explain(err, o.Client, "")
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "removed %d service(s), %d check(s); invalidated %d session(s)\n",
					resp.GetRemovedServices(), resp.GetRemovedChecks(), resp.GetInvalidatedSessions())
				return err
			})
		},
	}
	cmd.Flags().StringVar(&o.ServiceID, "service", "", "remove only this service instance (by id)")
	cmd.Flags().StringVar(&o.CheckID, "check", "", "remove only this check (by id)")
	return cmd
}

// addCatalogFlags exposes the server's catalog, session and agent-role
// settings (server.CatalogConfig).
func addCatalogFlags(f *pflag.FlagSet, c *server.CatalogConfig) {
	f.StringVar(&c.AgentNode, "agent-node", c.AgentNode, "catalog node this server is the Consul agent of (default: --name)")
	f.StringVar(&c.AgentAddress, "agent-address", c.AgentAddress, "that node's address (default: the --listen-http host)")
	f.DurationVar(&c.SessionTTLRecheck, "session-ttl-recheck", c.SessionTTLRecheck, "longest the leader sleeps between session TTL checks")
	f.DurationVar(&c.SessionTTLRetry, "session-ttl-retry", c.SessionTTLRetry, "pause before retrying a failed session invalidation")
	f.IntVar(&c.SessionInvalidateBatch, "session-invalidate-batch", c.SessionInvalidateBatch, "most expired sessions invalidated by one Raft entry")
	f.BoolVar(&c.EnableScriptChecks, "enable-script-checks", c.EnableScriptChecks, "run script checks (Args) registered through this server's /v1/agent API (anyone who may register a check can then run commands as the server)")
	f.DurationVar(&c.CheckReapInterval, "check-reap-interval", c.CheckReapInterval, "how often services whose check stayed critical past their DeregisterCriticalServiceAfter are deregistered")
}
