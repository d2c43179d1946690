// Command lodestone is Lodestone's one binary: the registry server, the dev
// node and the operator commands (kv, members, status).
//
// main builds the cobra root, runs it with a context that ends on SIGINT or
// SIGTERM, and is the only place that picks an exit code:
//
//	0    success
//	1    the command failed (one line on stderr says what and what to do)
//	2    the command line was wrong (unknown command, flag or argument)
//	N    lodestone lock: the locked command's own exit status
//	130  interrupted
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/internal/buildinfo"
)

// envEndpoints names the environment variable that supplies --endpoints'
// default.
const envEndpoints = "LODESTONE_ENDPOINTS"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run executes one command line and returns the process exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	root := newRootCmd(getenv)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "lodestone: "+oneLine(err.Error()))
	var ue *usageError
	var ce *exitCodeError
	switch {
	case errors.As(err, &ue):
		return 2
	case errors.As(err, &ce):
		return ce.code
	case ctx.Err() != nil:
		return 130
	}
	return 1
}

// newRootCmd builds the `lodestone` command tree. getenv supplies
// LODESTONE_ENDPOINTS.
func newRootCmd(getenv func(string) string) *cobra.Command {
	root := &cobra.Command{
		Use:   "lodestone",
		Short: "Lodestone: a Raft-replicated KV and service-discovery store",
		Long: `Lodestone is a Raft-replicated KV and service-discovery store.

Start a local node with "lodestone dev", then try:
  lodestone kv put greeting hello
  lodestone kv get greeting`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Runnable only to turn stray arguments into a usage error.
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
		// --version prints the one-line build; lodestone version the table.
		Version: buildinfo.Get().String(),
	}
	root.SetVersionTemplate(versionTemplate)
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usagef(cmd, "%v", err)
	})

	endpoints := []string{client.DefaultEndpoint}
	if env := strings.TrimSpace(getenv(envEndpoints)); env != "" {
		endpoints = splitList(env)
	}
	pf := root.PersistentFlags()
	pf.StringSlice("endpoints", endpoints,
		"servers' gRPC addresses, comma-separated (env "+envEndpoints+")")
	pf.Duration("timeout", 10*time.Second,
		"how long a client command may take in all, retries included")
	pf.String("token", "", "ACL token secret sent with every request (env "+envToken+", then CONSUL_HTTP_TOKEN)")
	pf.String("token-file", "", "file holding the ACL token secret (env "+envToken+"_FILE, then CONSUL_HTTP_TOKEN_FILE)")
	// NB: the environment's token is kept out of the flag's default, so
	// --help never prints a secret.
	root.Annotations = map[string]string{annToken: firstEnv(getenv, envToken, "CONSUL_HTTP_TOKEN"),
		annTokenFile: firstEnv(getenv, envToken+"_FILE", "CONSUL_HTTP_TOKEN_FILE")}
	addClientTLSFlags(pf, getenv)

	root.AddCommand(newServerCmd(getenv), newDevCmd(), newKVCmd(), newMembersCmd(), newStatusCmd(), newCompactCmd(), newGatewayCmd(getenv),
		newSnapshotCmd(), newRecoverCmd(), newAdmissionCmd())
	root.AddCommand(newCatalogCmd(), newHealthCmd(), newSessionCmd(), newLockCmd())
	root.AddCommand(newAgentCmd())
	root.AddCommand(newACLCmd(getenv))
	root.AddCommand(newTLSCmd())
	root.AddCommand(newVersionCmd())
	root.AddCommand(newHealthcheckCmd(getenv), newDemoCmd())
	root.AddCommand(newValidateConfigCmd())
	return root
}

// groupRunE serves commands that only group subcommands: with no
// arguments it prints help, otherwise the argument is an unknown command.
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef(cmd, "unknown command %q", args[0])
	}
	return cmd.Help()
}

// clientOptions are the persistent flags every client command shares.
type clientOptions struct {
	Endpoints []string
	Timeout   time.Duration
	Token     string           // ACL token secret; "" is the anonymous token
	WatchFrom client.WatchFrom // zero: followers
	TLS       *tls.Config      // nil: plain text
}

// clientFlags reads the persistent client flags of cmd.
func clientFlags(cmd *cobra.Command) (clientOptions, error) {
	raw, err := cmd.Flags().GetStringSlice("endpoints")
	if err != nil {
		return clientOptions{}, usagef(cmd, "--endpoints: %v", err)
	}
	timeout, err := cmd.Flags().GetDuration("timeout")
	if err != nil {
		return clientOptions{}, usagef(cmd, "--timeout: %v", err)
	}
	var eps []string
	for _, e := range raw {
		eps = append(eps, splitList(e)...)
	}
	if len(eps) == 0 {
		return clientOptions{}, usagef(cmd, "--endpoints is empty")
	}
	if timeout <= 0 {
		return clientOptions{}, usagef(cmd, "--timeout must be positive, not %v", timeout)
	}
	tok, err := tokenOf(cmd)
	if err != nil {
		return clientOptions{}, err
	}
	tlsCfg, err := clientTLS(cmd)
	if err != nil {
		return clientOptions{}, err
	}
	return clientOptions{Endpoints: eps, Timeout: timeout, Token: tok, TLS: tlsCfg}, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// newClient returns a client tuned for a one-shot command: it gives up on
// an unreachable cluster within a couple of seconds instead of waiting out
// --timeout, yet rides out a leader election.
func newClient(o clientOptions) (*client.Client, error) {
	dial := 2 * time.Second
	if o.Timeout < dial {
		dial = o.Timeout
	}
	c, err := client.New(client.Config{
		Endpoints:      o.Endpoints,
		DialTimeout:    dial,
		RequestTimeout: o.Timeout,
		BackoffBase:    100 * time.Millisecond,
		BackoffMax:     time.Second,
		MaxAttempts:    5 * len(o.Endpoints),
		WatchFrom:      o.WatchFrom,
		Token:          o.Token,
		TLS:            o.TLS,
	})
	if err != nil {
		return nil, fmt.Errorf("--endpoints: %w", err)
	}
	return c, nil
}

// withClient runs f with a client for o, bounded by o.Timeout.
func withClient(ctx context.Context, o clientOptions, f func(context.Context, *client.Client) error) error {
	c, err := newClient(o)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	err = f(ctx, c)
	if cerr := c.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close client: %w", cerr)
	}
	return err
}

// usageError is a wrong command line; main exits 2 for it.
type usageError struct {
	cmd string // command path, e.g. "lodestone kv put"
	msg string
}

func (e *usageError) Error() string {
	what := strings.TrimPrefix(e.cmd, "lodestone ")
	if what == "lodestone" {
		return fmt.Sprintf("%s: run 'lodestone --help'", e.msg)
	}
	return fmt.Sprintf("%s: %s: run '%s --help'", what, e.msg, e.cmd)
}

func usagef(cmd *cobra.Command, format string, args ...any) error {
	return &usageError{cmd: cmd.CommandPath(), msg: fmt.Sprintf(format, args...)}
}

// exactArgs requires len(names) arguments and names them in the error.
func exactArgs(names ...string) cobra.PositionalArgs {
	return rangeArgs(len(names), names...)
}

// rangeArgs requires between min and len(names) arguments.
func rangeArgs(min int, names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min || len(args) > len(names) {
			return usagef(cmd, "want %s, got %d argument(s)", strings.Join(names, " "), len(args))
		}
		return nil
	}
}

// noArgs rejects arguments with a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef(cmd, "unknown command or argument %q", args[0])
	}
	return nil
}

// hintError is a failure with what to do about it: "<what>: <hint>".
type hintError struct {
	err  error
	hint string
}

func (e *hintError) Error() string {
	return strings.TrimPrefix(e.err.Error(), "client: ") + ": " + e.hint
}

func (e *hintError) Unwrap() error { return e.err }

// explain attaches what to do to a client error. condHint is the advice
// for a failed precondition, which depends on the command.
func explain(err error, o clientOptions, condHint string) error {
	if err == nil {
		return nil
	}
	var ce *client.Error
	fromServer := errors.As(err, &ce) && ce.FromServer
	var hint string
	switch {
	case errors.Is(err, client.ErrUnknownOutcome):
		hint = "read the current state before retrying"
	case errors.Is(err, client.ErrCASFailed):
		hint = condHint
	case errors.Is(err, client.ErrUnavailable) && fromServer:
		hint = "the cluster has no leader or is shutting down; retry shortly and check 'lodestone status'"
	case errors.Is(err, client.ErrUnavailable):
		hint = fmt.Sprintf("no server answered at %s; start one with 'lodestone dev' or point --endpoints (or %s) at a running server",
			strings.Join(o.Endpoints, ","), envEndpoints)
	case errors.Is(err, context.DeadlineExceeded):
		hint = fmt.Sprintf("no answer within --timeout %v; check that %s is reachable ('lodestone status') or raise --timeout",
			o.Timeout, strings.Join(o.Endpoints, ","))
	case errors.Is(err, context.Canceled):
		hint = "interrupted"
	case errors.Is(err, client.ErrInvalidArgument):
		hint = "fix the request and retry"
	case errors.Is(err, client.ErrNotFound):
		hint = "list the members with 'lodestone members'"
	case errors.Is(err, client.ErrPermissionDenied):
		hint = "use a token with that permission (--token, --token-file or " + envToken + ")"
	default:
		hint = "check the server's log"
	}
	return &hintError{err: err, hint: hint}
}

// oneLine folds err's text onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// Output formats of read commands.
const (
	outputTable = "table"
	outputJSON  = "json"
)

// addOutputFlag adds -o/--output to cmd, bound to p.
func addOutputFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVarP(p, "output", "o", outputTable, "output format: table or json")
}

// clientOutputFlags is clientFlags for a command that also takes
// --output: it checks the format too.
func clientOutputFlags(cmd *cobra.Command, format string) (clientOptions, error) {
	co, err := clientFlags(cmd)
	if err != nil {
		return clientOptions{}, err
	}
	return co, checkOutput(cmd, format)
}

func checkOutput(cmd *cobra.Command, format string) error {
	switch format {
	case outputTable, outputJSON:
		return nil
	}
	return usagef(cmd, "--output %q: use table or json", format)
}

// writeJSON writes v as indented JSON and a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// table aligns rows into columns (two spaces apart) and writes them on
// flush, without trailing spaces.
type table struct {
	w   io.Writer
	buf bytes.Buffer
	tw  *tabwriter.Writer
}

func newTable(w io.Writer) *table {
	t := &table{w: w}
	t.tw = tabwriter.NewWriter(&t.buf, 0, 8, 2, ' ', 0)
	return t
}

// row adds one row.
func (t *table) row(cells ...any) {
	for i, c := range cells {
		if i > 0 {
			fmt.Fprint(t.tw, "\t")
		}
		fmt.Fprint(t.tw, c)
	}
	fmt.Fprintln(t.tw)
}

// flush writes the aligned rows.
func (t *table) flush() error {
	if err := t.tw.Flush(); err != nil {
		return err
	}
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(t.buf.String(), "\n") {
		if trimmed := strings.TrimRight(line, " \n"); trimmed != line {
			out.WriteString(trimmed)
			if strings.HasSuffix(line, "\n") {
				out.WriteString("\n")
			}
			continue
		}
		out.WriteString(line)
	}
	_, err := t.w.Write(out.Bytes())
	return err
}

// hexID formats a member id the way every command shows it.
func hexID(id uint64) string {
	if id == 0 {
		return "-"
	}
	return fmt.Sprintf("%x", id)
}
