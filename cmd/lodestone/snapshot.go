package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/internal/member"
	"github.com/lodestone-kv/lodestone/tools/compact"
	"github.com/lodestone-kv/lodestone/tools/snapshot"
)

func newSnapshotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Save, inspect and restore snapshots of the whole cluster state",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	cmd.AddCommand(newSnapshotSaveCmd(), newSnapshotInspectCmd(), newSnapshotRestoreCmd())
	return cmd
}

func newSnapshotSaveCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "save FILE",
		Short: "Stream a consistent snapshot from the cluster into FILE",
		Long: `Save streams the replicated state as of now (a linearizable read on the
serving member) into FILE, with a progress bar on stderr. The file ends with a
SHA-256 checksum; it is written to a temporary file, synced and renamed, so
FILE is either the old file or the complete new one.`,
		Args: exactArgs("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			co, err := clientFlags(cmd)
			if err != nil {
				return err
			}
			if err := checkOutput(cmd, output); err != nil {
				return err
			}
			ctx, cancel := contextWithTimeout(cmd, co)
			defer cancel()
			in, err := snapshot.Save(ctx, snapshot.SaveOptions{Endpoints: co.Endpoints, TLS: co.TLS, Path: args[0], Token: co.Token}, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("snapshot save: %w: check 'lodestone status' and retry", err)
			}
			if output == outputJSON {
				return writeJSON(cmd.OutOrStdout(), in)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "saved %s: index %d, term %d, %s, sha256 %s\n",
				in.Path, in.Index, in.Term, compact.HumanBytes(in.FileBytes), in.SHA256)
			return err
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func newSnapshotInspectCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "inspect FILE",
		Short: "Verify a snapshot file and show what it holds",
		Args:  exactArgs("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(cmd, output); err != nil {
				return err
			}
			in, err := snapshot.Inspect(args[0])
			if err != nil {
				return err
			}
			return renderSnapshotInfo(cmd.OutOrStdout(), output, in)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func renderSnapshotInfo(w io.Writer, format string, in snapshot.Info) error {
	if format == outputJSON {
		return writeJSON(w, in)
	}
	t := newTable(w)
	t.row("INDEX", in.Index)
	t.row("TERM", in.Term)
	t.row("TAKEN ON", in.Source)
	var ms []string
	for _, m := range in.Members {
		ms = append(ms, fmt.Sprintf("%s=%s (%s)", m.Name, m.PeerAddr, m.Role))
	}
	t.row("MEMBERS", strings.Join(ms, ", "))
	t.row("KEYS", in.Keys)
	t.row("NODES", in.Nodes)
	t.row("SERVICES", fmt.Sprintf("%d instances of %d services", in.Services, in.ServiceNames))
	t.row("SESSIONS", in.Sessions)
	t.row("SIZE", fmt.Sprintf("%s (%d bytes)", compact.HumanBytes(in.FileBytes), in.FileBytes))
	t.row("SHA256", in.SHA256)
	return t.flush()
}

func newSnapshotRestoreCmd() *cobra.Command {
	var o snapshot.RestoreOptions
	var initial string
	cmd := &cobra.Command{
		Use:   "restore FILE --data-dir DIR --name NAME --initial-cluster NAME=PEERADDR,...",
		Short: "Prepare the data dir of a member of a new cluster from a snapshot",
		Long: `Restore writes DIR so that 'lodestone server --name NAME --data-dir DIR
--initial-cluster ...' starts as a member of a new cluster holding the
snapshot's state. Run it once per member, with the same FILE and the same
--initial-cluster, then start every member. DIR must be empty; a damaged or
truncated FILE is refused and nothing is written.`,
		Args: exactArgs("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case o.DataDir == "":
				return usagef(cmd, "--data-dir is required (the new member's --data-dir)")
			case o.Name == "":
				return usagef(cmd, "--name is required (the new member's --name)")
			case initial == "":
				return usagef(cmd, "--initial-cluster is required (every member of the new cluster)")
			}
			ic, err := member.ParseCluster(initial)
			if err != nil {
				return usagef(cmd, "--initial-cluster: %v", err)
			}
			o.InitialCluster = ic
			o.Path = args[0]
			_, err = snapshot.Restore(o, cmd.OutOrStdout())
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data-dir", "", "the new member's data directory (must be empty)")
	f.StringVar(&o.Name, "name", "", "the new member's name")
	f.StringVar(&initial, "initial-cluster", "", "every member of the new cluster as name=peeraddr,...")
	return cmd
}
