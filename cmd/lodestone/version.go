package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/internal/buildinfo"
)

func newVersionCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Show this binary's version, commit, build date and Go version",
		Long: `Show which build this binary is: its version, the commit it was built from,
the build date (the commit's time), the Go version and the OS and architecture.
A running server's version is in "lodestone status".`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(cmd, output); err != nil {
				return err
			}
			return renderVersion(cmd.OutOrStdout(), output, buildinfo.Get())
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func renderVersion(w io.Writer, format string, i buildinfo.Info) error {
	if format == outputJSON {
		return writeJSON(w, i)
	}
	tw := newTable(w)
	tw.row("version", i.Version)
	tw.row("commit", i.Commit)
	tw.row("built", i.Date)
	tw.row("go", i.GoVersion)
	tw.row("platform", i.OS+"/"+i.Arch)
	return tw.flush()
}

// versionTemplate is what --version prints: the one-line form.
const versionTemplate = `lodestone {{.Version}}
`
