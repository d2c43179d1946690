package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

func newMembersCmd() *cobra.Command {
	var o membersListOptions
	cmd := &cobra.Command{
		Use:   "members",
		Short: "List the cluster's members; add, remove, promote them, move leadership",
		Long: `List the cluster's members (table: ID, NAME, PEER, GRPC, HTTP, ROLE, LEADER),
or change the membership with a subcommand. Members are named by NAME or by
the hexadecimal ID this table shows.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Client, err = clientOutputFlags(cmd, o.Output); err != nil {
				return err
			}
			return runMembersList(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	addOutputFlag(cmd, &o.Output)
	cmd.AddCommand(newMembersAddCmd(), newMembersRemoveCmd(), newMembersPromoteCmd(), newMembersTransferLeaderCmd())
	return cmd
}

// jsonMember is a member as -o json prints it. IDs are hex strings: they
// are 64-bit hashes, which JSON numbers (doubles in jq, JavaScript) mangle.
type jsonMember struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	PeerAddr string `json:"peer_addr"`
	GRPCAddr string `json:"grpc_addr"`
	HTTPAddr string `json:"http_addr"`
	Role     string `json:"role"`
	// AutoPromote: a learner the leader makes a voter once caught up.
	AutoPromote bool `json:"auto_promote,omitempty"`
	Leader      bool `json:"leader"`
}

func role(m *lodestonepb.Member) string {
	if m.GetLearner() {
		return "learner"
	}
	return "voter"
}

// roleColumn is the table's ROLE: a learner awaiting automatic promotion
// says so.
func roleColumn(m *lodestonepb.Member) string {
	if m.GetLearner() && m.GetAutoPromote() {
		return "learner (auto-promote)"
	}
	return role(m)
}

func toJSONMember(m *lodestonepb.Member, leader uint64) jsonMember {
	return jsonMember{
		ID: hexID(m.GetId()), Name: m.GetName(), PeerAddr: m.GetPeerAddr(), GRPCAddr: m.GetGrpcAddr(),
		HTTPAddr: m.GetHttpAddr(), Role: role(m), AutoPromote: m.GetAutoPromote(), Leader: leader != 0 && m.GetId() == leader,
	}
}

// sortedMembers returns ms sorted by name (then id) without modifying ms.
func sortedMembers(ms []*lodestonepb.Member) []*lodestonepb.Member {
	out := slices.Clone(ms)
	slices.SortFunc(out, func(a, b *lodestonepb.Member) int {
		if c := strings.Compare(a.GetName(), b.GetName()); c != 0 {
			return c
		}
		switch {
		case a.GetId() < b.GetId():
			return -1
		case a.GetId() > b.GetId():
			return 1
		}
		return 0
	})
	return out
}

// memberLabel is how messages name a member: `n1 (id 8e9e05c52164694d)`.
func memberLabel(m *lodestonepb.Member) string {
	return fmt.Sprintf("%s (id %s)", m.GetName(), hexID(m.GetId()))
}

// resolveMember finds the member arg names: by exact name first, then by
// id in hex (as tables show it, optional 0x) or in decimal.
func resolveMember(ms []*lodestonepb.Member, arg string) (*lodestonepb.Member, error) {
	for _, m := range ms {
		if m.GetName() == arg {
			return m, nil
		}
	}
	if id, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(arg), "0x"), 16, 64); err == nil {
		for _, m := range ms {
			if m.GetId() == id {
				return m, nil
			}
		}
	}
	if id, err := strconv.ParseUint(arg, 10, 64); err == nil {
		for _, m := range ms {
			if m.GetId() == id {
				return m, nil
			}
		}
	}
	names := make([]string, 0, len(ms))
	for _, m := range sortedMembers(ms) {
		names = append(names, m.GetName())
	}
	return nil, fmt.Errorf("no member is named or has id %q (members: %s): list them with 'lodestone members'", arg, strings.Join(names, ", "))
}

// ---- members (list) ----

type membersListOptions struct {
	Client clientOptions
	Output string
}

func runMembersList(ctx context.Context, o membersListOptions, w io.Writer) error {
	return withClient(ctx, o.Client, func(ctx context.Context, c *client.Client) error {
		resp, err := c.Members(ctx)
		if err != nil {
			return explain(err, o.Client, "")
		}
		return renderMembers(w, o.Output, resp.GetMembers(), resp.GetHeader().GetLeaderId())
	})
}

// renderMembers prints members sorted by name: a table with a "*" in the
// LEADER column of the leader, or a JSON array.
func renderMembers(w io.Writer, format string, ms []*lodestonepb.Member, leader uint64) error {
	ms = sortedMembers(ms)
	if format == outputJSON {
		out := make([]jsonMember, 0, len(ms))
		for _, m := range ms {
			out = append(out, toJSONMember(m, leader))
		}
		return writeJSON(w, out)
	}
	tw := newTable(w)
	tw.row("ID", "NAME", "PEER", "GRPC", "HTTP", "ROLE", "LEADER")
	for _, m := range ms {
		mark := ""
		if leader != 0 && m.GetId() == leader {
			mark = "*"
		}
		tw.row(hexID(m.GetId()), m.GetName(), dash(m.GetPeerAddr()), dash(m.GetGrpcAddr()), dash(m.GetHttpAddr()), roleColumn(m), mark)
	}
	return tw.flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ---- members add ----

type membersAddOptions struct {
	Client   clientOptions
	Name     string
	PeerAddr string
	GRPCAddr string
	HTTPAddr string
	Learner  bool
	VoterNow bool
	Output   string
}

func newMembersAddCmd() *cobra.Command {
	var o membersAddOptions
	cmd := &cobra.Command{
		Use:   "add NAME --peer ADDR --grpc ADDR --http ADDR [--learner | --voter-now]",
		Short: "Add a member; then start it with the command this prints",
		Long: `Add a member. It joins as a learner, which no quorum waits on, and the
leader makes it a voter once it has caught up (the server's
--auto-promote-lag), so a member that never starts never costs the cluster
its quorum. --learner keeps it a learner until 'lodestone members promote'.
--voter-now adds a voter at once; start the new member first (with --join):
the server refuses a voter whose peer address does not answer.`,
		Args: exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Client, err = clientOutputFlags(cmd, o.Output); err != nil {
				return err
			}
			if o.PeerAddr == "" {
				return usagef(cmd, "--peer is required: the address other members reach the new one at")
			}
			if o.Learner && o.VoterNow {
				return usagef(cmd, "--learner and --voter-now exclude each other")
			}
			o.Name = args[0]
			return runMembersAdd(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&o.PeerAddr, "peer", "", "the new member's Raft peer address (required)")
	cmd.Flags().StringVar(&o.GRPCAddr, "grpc", "", "the new member's client gRPC address")
	cmd.Flags().StringVar(&o.HTTPAddr, "http", "", "the new member's HTTP address")
	cmd.Flags().BoolVar(&o.Learner, "learner", false, "keep it a non-voting member until 'members promote' (default: promoted automatically once caught up)")
	cmd.Flags().BoolVar(&o.VoterNow, "voter-now", false, "add a voter at once; the member must already answer on its peer address")
	addOutputFlag(cmd, &o.Output)
	return cmd
}

func runMembersAdd(ctx context.Context, o membersAddOptions, w io.Writer) error {
	return withClient(ctx, o.Client, func(ctx context.Context, c *client.Client) error {
		var opts []client.MemberOption
		if o.VoterNow {
			opts = append(opts, client.VoterNow())
		}
		resp, err := c.AddMember(ctx, &lodestonepb.Member{
			Name: o.Name, PeerAddr: o.PeerAddr, GrpcAddr: o.GRPCAddr, HttpAddr: o.HTTPAddr, Learner: o.Learner,
		}, opts...)
		if err != nil {
			return explain(err, o.Client, "check the member list with 'lodestone members'")
		}
		return renderMembersAdd(w, o.Output, resp)
	})
}

// renderMembersAdd says what was added and how to start it.
func renderMembersAdd(w io.Writer, format string, resp *lodestonepb.AddMemberResponse) error {
	m := resp.GetMember()
	if format == outputJSON {
		out := struct {
			Member  jsonMember   `json:"member"`
			Members []jsonMember `json:"members"`
		}{Member: toJSONMember(m, resp.GetHeader().GetLeaderId())}
		for _, x := range sortedMembers(resp.GetMembers()) {
			out.Members = append(out.Members, toJSONMember(x, resp.GetHeader().GetLeaderId()))
		}
		return writeJSON(w, out)
	}
	var initial []string
	for _, x := range sortedMembers(resp.GetMembers()) {
		initial = append(initial, x.GetName()+"="+x.GetPeerAddr())
	}
	start := []string{"lodestone server", "--name " + m.GetName(), "--data-dir DIR", "--listen-peer " + m.GetPeerAddr()}
	if m.GetGrpcAddr() != "" {
		start = append(start, "--listen-grpc "+m.GetGrpcAddr())
	}
	if m.GetHttpAddr() != "" {
		start = append(start, "--listen-http "+m.GetHttpAddr())
	}
	start = append(start, "--join", "--initial-cluster "+strings.Join(initial, ","))
	if _, err := fmt.Fprintf(w, "added %s %s\nstart it with:\n  %s\n", role(m), memberLabel(m), strings.Join(start, " ")); err != nil {
		return err
	}
	if m.GetAutoPromote() {
		_, err := fmt.Fprintln(w, "the leader makes it a voter once it has caught up; 'lodestone members' shows its role")
		return err
	}
	return nil
}

// ---- members remove / promote ----

type memberRefOptions struct {
	Client clientOptions
	Member string // name or id
	Force  bool   // remove: allow leaving a single voter
	Output string
}

func newMembersRemoveCmd() *cobra.Command {
	cmd, o := newMemberRefCmd("remove NAME|ID", "Remove a member", []string{"rm"}, runMembersRemove)
	cmd.Flags().BoolVar(&o.Force, "force", false, "remove a voter even if it leaves a single voter")
	return cmd
}

func newMembersPromoteCmd() *cobra.Command {
	cmd, _ := newMemberRefCmd("promote NAME|ID", "Make a learner a voter", nil, runMembersPromote)
	return cmd
}

func newMemberRefCmd(use, short string, aliases []string, run func(context.Context, memberRefOptions, io.Writer) error) (*cobra.Command, *memberRefOptions) {
	o := &memberRefOptions{}
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Aliases: aliases,
		Args:    exactArgs("NAME|ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Client, err = clientOutputFlags(cmd, o.Output); err != nil {
				return err
			}
			o.Member = args[0]
			return run(cmd.Context(), *o, cmd.OutOrStdout())
		},
	}
	addOutputFlag(cmd, &o.Output)
	return cmd, o
}

// memberChange is what remove and promote print.
type memberChange struct {
	Action  string       `json:"action"` // "removed", "promoted"
	Member  jsonMember   `json:"member"`
	Members []jsonMember `json:"members"`
}

func runMembersRemove(ctx context.Context, o memberRefOptions, w io.Writer) error {
	return withClient(ctx, o.Client, func(ctx context.Context, c *client.Client) error {
		list, err := c.Members(ctx)
		if err != nil {
			return explain(err, o.Client, "")
		}
		m, err := resolveMember(list.GetMembers(), o.Member)
		if err != nil {
			return err
		}
		var opts []client.MemberOption
		if o.Force {
			opts = append(opts, client.Force())
		}
		resp, err := c.RemoveMember(ctx, client.ByID(m.GetId()), opts...)
		if err != nil {
			return explain(err, o.Client, "check the member list with 'lodestone members'")
		}
		return renderMemberChange(w, o.Output, "removed", m, resp.GetMembers(), resp.GetHeader().GetLeaderId())
	})
}

func runMembersPromote(ctx context.Context, o memberRefOptions, w io.Writer) error {
	return withClient(ctx, o.Client, func(ctx context.Context, c *client.Client) error {
		list, err := c.Members(ctx)
		if err != nil {
			return explain(err, o.Client, "")
		}
		m, err := resolveMember(list.GetMembers(), o.Member)
		if err != nil {
			return err
		}
		resp, err := c.PromoteMember(ctx, client.ByID(m.GetId()))
		if err != nil {
			return explain(err, o.Client, "only a learner that has caught up with the leader can be promoted; check 'lodestone members' and 'lodestone status'")
		}
		promoted := m
		for _, x := range resp.GetMembers() {
			if x.GetId() == m.GetId() {
				promoted = x
			}
		}
		return renderMemberChange(w, o.Output, "promoted", promoted, resp.GetMembers(), resp.GetHeader().GetLeaderId())
	})
}

func renderMemberChange(w io.Writer, format, action string, m *lodestonepb.Member, ms []*lodestonepb.Member, leader uint64) error {
	if format == outputJSON {
		out := memberChange{Action: action, Member: toJSONMember(m, leader), Members: []jsonMember{}}
		for _, x := range sortedMembers(ms) {
			out.Members = append(out.Members, toJSONMember(x, leader))
		}
		return writeJSON(w, out)
	}
	var err error
	switch action {
	case "promoted":
		_, err = fmt.Fprintf(w, "promoted %s to voter\n", memberLabel(m))
	default:
		_, err = fmt.Fprintf(w, "%s %s\n", action, memberLabel(m))
	}
	return err
}

// ---- members transfer-leader ----

type transferLeaderOptions struct {
	Client clientOptions
	To     string // name or id; "" lets the server pick
	Output string
}

func newMembersTransferLeaderCmd() *cobra.Command {
	var o transferLeaderOptions
	cmd := &cobra.Command{
		Use:   "transfer-leader [--to NAME|ID]",
		Short: "Move leadership to another voter (default: the most up-to-date one)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Client, err = clientOutputFlags(cmd, o.Output); err != nil {
				return err
			}
			return runTransferLeader(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&o.To, "to", "", "the voter to lead (name or id)")
	addOutputFlag(cmd, &o.Output)
	return cmd
}

func runTransferLeader(ctx context.Context, o transferLeaderOptions, w io.Writer) error {
	return withClient(ctx, o.Client, func(ctx context.Context, c *client.Client) error {
		list, err := c.Members(ctx)
		if err != nil {
			return explain(err, o.Client, "")
		}
		var to *lodestonepb.MemberRef
		if o.To != "" {
			m, err := resolveMember(list.GetMembers(), o.To)
			if err != nil {
				return err
			}
			to = client.ByID(m.GetId())
		}
		resp, err := c.TransferLeader(ctx, to)
		if err != nil {
			return explain(err, o.Client, "leadership can move only to a voter that is up to date; check 'lodestone members' and 'lodestone status'")
		}
		leader := &lodestonepb.Member{Id: resp.GetLeaderId()}
		for _, m := range list.GetMembers() {
			if m.GetId() == resp.GetLeaderId() {
				leader = m
			}
		}
		return renderTransferLeader(w, o.Output, leader, resp.GetHeader().GetTerm())
	})
}

func renderTransferLeader(w io.Writer, format string, leader *lodestonepb.Member, term uint64) error {
	if format == outputJSON {
		return writeJSON(w, struct {
			Leader jsonMember `json:"leader"`
			Term   uint64     `json:"term"`
		}{toJSONMember(leader, leader.GetId()), term})
	}
	_, err := fmt.Fprintf(w, "leader is now %s\n", memberLabel(leader))
	return err
}
