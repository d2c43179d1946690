package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/tools/snapshot"
)

func newRecoverCmd() *cobra.Command {
	var o snapshot.RecoverOptions
	cmd := &cobra.Command{
		Use:   "recover --data-dir DIR --name NAME [--dry-run]",
		Short: "Turn a stopped survivor's data into a one-node cluster after quorum loss",
		Long: `Recover is for when a majority of voters is lost for good. It rewrites a
stopped node's data so the node starts as the only member of its cluster,
keeping every entry it holds: it appends the removal of every other member
and commits it. It prints what it will do first; --dry-run prints only.

Afterwards start the node with --initial-cluster listing only itself and add
the other members back with 'lodestone members add'. It refuses while the node
is running.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case o.DataDir == "":
				return usagef(cmd, "--data-dir is required (the stopped node's --data-dir)")
			case o.Name == "":
				return usagef(cmd, "--name is required (the node's --name)")
			}
			_, err := snapshot.Recover(o, cmd.OutOrStdout())
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data-dir", "", "the stopped node's data directory")
	f.StringVar(&o.Name, "name", "", "the node's --name")
	f.BoolVar(&o.DryRun, "dry-run", false, "print the plan and change nothing")
	return cmd
}

// contextWithTimeout bounds a command by --timeout.
func contextWithTimeout(cmd *cobra.Command, o clientOptions) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), o.Timeout)
}
