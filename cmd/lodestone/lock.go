package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

type lockOptions struct {
	Client    clientOptions
	Prefix    string
	Command   []string
	Node      string
	Address   string
	Name      string
	TTL       time.Duration
	LockDelay time.Duration
	Stdin     io.Reader
	Stdout    io.Writer
	Stderr    io.Writer
}

func newLockCmd() *cobra.Command {
	var o lockOptions
	host, _ := os.Hostname()
	cmd := &cobra.Command{
		Use:   "lock PREFIX -- COMMAND [ARG]...",
		Short: "Run a command while holding a cluster-wide lock",
		Long: `Run COMMAND while holding the lock PREFIX/.lock, as 'consul lock' does:
wait until the lock is free, take it with a session that is renewed while
COMMAND runs, release it when COMMAND exits, and exit with COMMAND's code.
If the lock is lost (the cluster invalidated the session), COMMAND gets
SIGTERM and lodestone exits 1. The session belongs to catalog node --node,
registered with --address if it is not yet.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 || len(args) < 2 {
				return usagef(cmd, "want PREFIX -- COMMAND [ARG]...")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Client, err = clientFlags(cmd); err != nil {
				return err
			}
			if o.Node == "" {
				return usagef(cmd, "--node is empty and the hostname is unknown: name the catalog node")
			}
			o.Prefix, o.Command = args[0], args[1:]
			o.Stdin, o.Stdout, o.Stderr = cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runLock(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Node, "node", host, "the catalog node the lock's session belongs to")
	f.StringVar(&o.Address, "address", "127.0.0.1", "the node's address, if it must be registered")
	f.StringVar(&o.Name, "name", "lodestone lock", "the session's name")
	f.DurationVar(&o.TTL, "ttl", 15*time.Second, "the session's TTL (10s..24h); renewed every TTL/2")
	f.DurationVar(&o.LockDelay, "lock-delay", 15*time.Second, "keep others off the lock this long after this holder is lost (0: none)")
	return cmd
}

// exitCodeError makes main exit with code (the locked command's).
type exitCodeError struct {
	code int
	err  error
}

func (e *exitCodeError) Error() string { return e.err.Error() }
func (e *exitCodeError) Unwrap() error { return e.err }

func runLock(ctx context.Context, o lockOptions) error {
	key := strings.TrimSuffix(o.Prefix, "/") + "/.lock"
	c, err := newClient(o.Client)
	if err != nil {
		return err
	}
	defer c.Close()
	// Every call below gets o.Timeout; waiting for the lock and running
	// the command do not.
	call := func(f func(context.Context) error) error {
		cctx, cancel := context.WithTimeout(ctx, o.Client.Timeout)
		defer cancel()
		return f(cctx)
	}
	if err := call(func(ctx context.Context) error { return ensureNode(ctx, c, o.Node, o.Address) }); err != nil {
		return explain(err, o.Client, "")
	}
	delay := o.LockDelay
	if delay == 0 {
		delay = -1 // client.LockOptions: negative means none
	}
	held, err := c.Lock(ctx, client.LockOptions{Key: key, Node: o.Node, SessionName: o.Name, TTL: o.TTL, LockDelay: delay})
	if err != nil {
		return explain(err, o.Client, "check the session flags (--ttl 10s..24h) and that the cluster is reachable")
	}
	code, runErr := runLocked(ctx, o, held.Lost())
	uerr := call(func(ctx context.Context) error { return held.Unlock(ctx) })
	switch {
	case runErr != nil:
		return runErr
	case uerr != nil:
		return explain(fmt.Errorf("release lock %s: %w", key, uerr), o.Client, "")
	case code != 0:
		return &exitCodeError{code: code, err: fmt.Errorf("%s exited with status %d", o.Command[0], code)}
	}
	return nil
}

// ensureNode registers node with addr unless it is registered.
func ensureNode(ctx context.Context, c *client.Client, node, addr string) error {
	resp, err := c.Node(ctx, node)
	if err != nil || resp.GetNode() != nil {
		return err
	}
	_, err = c.Register(ctx, &lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: node, Address: addr}})
	return err
}

// runLocked runs the command; if the lock is lost first it sends SIGTERM
// and reports the loss.
func runLocked(ctx context.Context, o lockOptions, lost <-chan struct{}) (int, error) {
	cmd := exec.Command(o.Command[0], o.Command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = o.Stdin, o.Stdout, o.Stderr
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", o.Command[0], err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var why error
	select {
	case err := <-done:
		return exitCode(err)
	case <-lost:
		why = fmt.Errorf("lock lost while %s ran (the session expired or was invalidated); sent it SIGTERM", o.Command[0])
	case <-ctx.Done():
		why = fmt.Errorf("interrupted; sent %s SIGTERM", o.Command[0])
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	<-done
	return 0, why
}

func exitCode(err error) (int, error) {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return ee.ExitCode(), nil
	}
	return 0, fmt.Errorf("wait for command: %w", err)
}
