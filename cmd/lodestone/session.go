package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

func newSessionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Create, renew, destroy and list sessions",
		Long: `Create, renew, destroy and list sessions (Consul's /v1/session). A
session with a TTL must be renewed within TTL × 2 or the leader invalidates
it, releasing (or, with --behavior delete, deleting) the keys it locks.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(newSessionCreateCmd(), newSessionRenewCmd(), newSessionDestroyCmd(), newSessionListCmd(), newSessionInfoCmd())
	return cmd
}

// jsonSession is a session as -o json prints it.
type jsonSession struct {
	ID          string   `json:"id"`
	Name        string   `json:"name,omitempty"`
	Node        string   `json:"node"`
	Behavior    string   `json:"behavior"`
	TTL         string   `json:"ttl,omitempty"`
	LockDelay   string   `json:"lock_delay"`
	Checks      []string `json:"checks,omitempty"`
	CreateIndex uint64   `json:"create_index"`
}

func behaviorName(b lodestonepb.SessionBehavior) string {
	if b == lodestonepb.SessionBehavior_SESSION_DELETE {
		return "delete"
	}
	return "release"
}

func toJSONSession(s *lodestonepb.SessionEntry) jsonSession {
	j := jsonSession{ID: s.GetId(), Name: s.GetName(), Node: s.GetNode(), Behavior: behaviorName(s.GetBehavior()),
		LockDelay: s.GetLockDelay().AsDuration().String(), CreateIndex: s.GetCreateIndex()}
	if s.GetTtl() != nil {
		j.TTL = s.GetTtl().AsDuration().String()
	}
	j.Checks = append(append(j.Checks, s.GetChecks()...), s.GetNodeChecks()...)
	for _, c := range s.GetServiceChecks() {
		j.Checks = append(j.Checks, c.GetId())
	}
	return j
}

func renderSessions(w io.Writer, format string, list []*lodestonepb.SessionEntry) error {
	if format == outputJSON {
		out := make([]jsonSession, 0, len(list))
		for _, s := range list {
			out = append(out, toJSONSession(s))
		}
		return writeJSON(w, out)
	}
	tw := newTable(w)
	tw.row("ID", "NAME", "NODE", "BEHAVIOR", "TTL", "LOCK-DELAY", "CHECKS")
	for _, s := range list {
		j := toJSONSession(s)
		tw.row(j.ID, dash(j.Name), j.Node, j.Behavior, dash(j.TTL), j.LockDelay, joinOrDash(j.Checks))
	}
	return tw.flush()
}

type sessionCreateOptions struct {
	Client    clientOptions
	Node      string
	Name      string
	TTL       time.Duration
	LockDelay time.Duration
	Behavior  string
	Checks    []string
	Output    string
}

func newSessionCreateCmd() *cobra.Command {
	var o sessionCreateOptions
	cmd := &cobra.Command{
		Use:   "create --node NODE [--ttl D] [--name N] [--behavior release|delete] [--lock-delay D] [--check ID]...",
		Short: "Create a session and print its id",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Client, err = clientOutputFlags(cmd, o.Output); err != nil {
				return err
			}
			if o.Node == "" {
				return usagef(cmd, "--node is required: the registered catalog node the session belongs to")
			}
			if o.Behavior != "release" && o.Behavior != "delete" {
				return usagef(cmd, "--behavior %q: use release or delete", o.Behavior)
			}
			return runSessionCreate(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Node, "node", "", "the catalog node the session belongs to (required)")
	f.StringVar(&o.Name, "name", "", "a label for the session")
	f.DurationVar(&o.TTL, "ttl", 0, "invalidate the session unless renewed within this (10s..24h; 0: no TTL)")
	f.DurationVar(&o.LockDelay, "lock-delay", 15*time.Second, "keep others off the session's keys this long after it is invalidated")
	f.StringVar(&o.Behavior, "behavior", "release", "what invalidation does to the keys it holds: release or delete")
	f.StringArrayVar(&o.Checks, "check", nil, "a check id on the node that invalidates the session when critical (repeatable)")
	addOutputFlag(cmd, &o.Output)
	return cmd
}

func runSessionCreate(ctx context.Context, o sessionCreateOptions, w io.Writer) error {
	se := &lodestonepb.SessionEntry{Name: o.Name, Node: o.Node, Checks: o.Checks, LockDelay: durationpb.New(o.LockDelay)}
	if o.Behavior == "delete" {
		se.Behavior = lodestonepb.SessionBehavior_SESSION_DELETE
	}
	if o.TTL != 0 {
		se.Ttl = durationpb.New(o.TTL)
	}
	return withClient(ctx, o.Client, func(ctx context.Context, c *client.Client) error {
		s, err := c.CreateSession(ctx, se)
		if err != nil {
			return explain(err, o.Client, "register the node first ('lodestone catalog register') and bind only passing checks")
		}
		if o.Output == outputJSON {
			return writeJSON(w, toJSONSession(s))
		}
		_, err = fmt.Fprintln(w, s.GetId())
		return err
	})
}

// sessionIDCmd builds renew and destroy: one session id argument.
func sessionIDCmd(use, short string, run func(context.Context, *client.Client, string, io.Writer) error) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			co, err := clientFlags(cmd)
			if err != nil {
				return err
			}
			return withClient(cmd.Context(), co, func(ctx context.Context, c *client.Client) error {
				return explain(run(ctx, c, args[0], cmd.OutOrStdout()), co, "the session no longer exists (it expired or was destroyed); create a new one")
			})
		},
	}
}

func newSessionRenewCmd() *cobra.Command {
	return sessionIDCmd("renew ID", "Renew a session's TTL", func(ctx context.Context, c *client.Client, id string, w io.Writer) error {
		if _, err := c.RenewSession(ctx, id); err != nil {
			return err
		}
		_, err := fmt.Fprintf(w, "renewed %s\n", id)
		return err
	})
}

func newSessionDestroyCmd() *cobra.Command {
	return sessionIDCmd("destroy ID", "Destroy a session, releasing its locks", func(ctx context.Context, c *client.Client, id string, w io.Writer) error {
		existed, err := c.DestroySession(ctx, id)
		if err != nil {
			return err
		}
		if !existed {
			_, err = fmt.Fprintf(w, "no session %s (nothing to do)\n", id)
			return err
		}
		_, err = fmt.Fprintf(w, "destroyed %s\n", id)
		return err
	})
}

func newSessionListCmd() *cobra.Command {
	var node string
	cmd := readCmd("list [--node NODE]", "List sessions", noArgs,
		func(ctx context.Context, o clientOptions, format string, _ []string, w io.Writer) error {
			return withClient(ctx, o, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Sessions(ctx, node)
				if err != nil {
					return explain(err, o, "")
				}
				return renderSessions(w, format, resp.GetSessions())
			})
		})
	cmd.Flags().StringVar(&node, "node", "", "only the sessions of this node")
	return cmd
}

func newSessionInfoCmd() *cobra.Command {
	cmd := readCmd("info ID", "Show one session", exactArgs("ID"),
		func(ctx context.Context, o clientOptions, format string, args []string, w io.Writer) error {
			return withClient(ctx, o, func(ctx context.Context, c *client.Client) error {
				resp, err := c.SessionInfo(ctx, args[0])
				if err != nil {
					return explain(err, o, "")
				}
				if resp.GetSession() == nil {
					return fmt.Errorf("no session %s (it expired or was destroyed): list them with 'lodestone session list'", args[0])
				}
				return renderSessions(w, format, []*lodestonepb.SessionEntry{resp.GetSession()})
			})
		})
	return cmd
}
