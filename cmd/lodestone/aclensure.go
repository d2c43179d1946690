package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/acl"
)

// What lets an ACL setup run again without failing (a Kubernetes Job, a
// provisioning script): a bootstrap with a secret chosen in advance that
// accepts an earlier bootstrap with the same secret, and creates that
// update the policy or token already there.

// bootstrapRetryEvery is the pause between bootstrap attempts under --wait.
const bootstrapRetryEvery = time.Second

func (a *aclCLI) bootstrapCmd() *cobra.Command {
	var allowBootstrapped bool
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "bootstrap [FILE]",
		Short: "Create the first management token (once)",
		Long: `Create the first management token. It can be done once: later calls are refused.

With FILE (- for stdin), the token's secret is the UUID FILE holds, as with
"consul acl bootstrap FILE": a secret chosen in advance (kept in a Kubernetes
Secret or a vault) becomes the management token.

--allow-bootstrapped makes a repeated run succeed: when the ACL system is
already bootstrapped, it checks that FILE's secret is a working management
token instead of failing. --wait retries while the cluster cannot answer
(unreachable, no leader yet) for up to that long.`,
		Args: rangeArgs(0, "[FILE]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if allowBootstrapped && len(args) == 0 {
				return usagef(cmd, "--allow-bootstrapped needs FILE: without a preset secret there is no token to check")
			}
			if wait < 0 {
				return usagef(cmd, "--wait %v: use 0 (one attempt) or a positive duration", wait)
			}
			secret := ""
			if len(args) == 1 {
				var err error
				if secret, err = readSecretArg(cmd, "FILE", args[0]); err != nil {
					return err
				}
			}
			c, format, err := a.client(cmd)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			t, err := bootstrapUntil(cmd.Context(), c, secret, time.Now().Add(wait), log)
			if alreadyBootstrapped(err) && allowBootstrapped {
				if t, err = managementToken(c, secret); err != nil {
					return fmt.Errorf("the ACL system is already bootstrapped, and the secret in %s is not a working management token: %w", args[0], serverErr(err))
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "ACL system already bootstrapped: the secret in %s is a working management token\n", args[0])
			} else if err != nil {
				return serverErr(err)
			}
			return printToken(cmd.OutOrStdout(), format, t)
		},
	}
	cmd.Flags().BoolVar(&allowBootstrapped, "allow-bootstrapped", false, "succeed if the ACL system is already bootstrapped and FILE's secret is a working management token")
	cmd.Flags().DurationVar(&wait, "wait", 0, "keep retrying this long while the cluster is unreachable or has no leader (0: one attempt)")
	return cmd
}

// readSecretArg reads a secret from path, or from stdin for "-".
func readSecretArg(cmd *cobra.Command, what, path string) (string, error) {
	if path != "-" {
		return readToken(cmd, what, path)
	}
	b, err := io.ReadAll(cmd.InOrStdin())
	if err != nil {
		return "", fmt.Errorf("%s: read stdin: %w", what, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" || strings.ContainsAny(s, " \t\r\n") {
		return "", usagef(cmd, "%s: stdin must hold one secret on one line", what)
	}
	return s, nil
}

// bootstrapUntil bootstraps, retrying until deadline while the failure is
// one a later attempt may not meet (see retryable).
func bootstrapUntil(ctx context.Context, c *consul.ACL, secret string, deadline time.Time, log *slog.Logger) (*consul.ACLToken, error) {
	var logged time.Time
	for {
		t, _, err := c.BootstrapWithToken(secret)
		if err == nil || !retryable(err) || !time.Now().Before(deadline) {
			return t, err
		}
		// NB: one line per 10s, not per attempt: a Job's log stays readable.
		if time.Since(logged) >= 10*time.Second {
			log.Info("waiting for the cluster to answer", "err", err.Error(), "gives_up_in", time.Until(deadline).Round(time.Second).String())
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(bootstrapRetryEvery):
		}
	}
}

// retryable: the server did not answer, or answered 5xx (no leader, an
// election). A 4xx is the same on every try.
func retryable(err error) bool {
	var se consul.StatusError
	if errors.As(err, &se) {
		return se.Code >= 500
	}
	return true
}

// alreadyBootstrapped recognises the refusal of a second bootstrap (Consul
// and Lodestone answer it alike).
func alreadyBootstrapped(err error) bool {
	var se consul.StatusError
	return errors.As(err, &se) && se.Code == 403 && strings.Contains(se.Body, "ACL bootstrap no longer allowed")
}

// managementToken returns the token secret is, if it links the
// global-management policy.
func managementToken(c *consul.ACL, secret string) (*consul.ACLToken, error) {
	t, _, err := c.TokenReadSelf(&consul.QueryOptions{Token: secret})
	if err != nil {
		return nil, err
	}
	for _, p := range t.Policies {
		if p.ID == acl.GlobalManagementPolicyID {
			return t, nil
		}
	}
	return nil, fmt.Errorf("token %s does not link the %s policy", t.AccessorID, acl.GlobalManagementPolicyName)
}

// createOrUpdatePolicy creates p, or with update set updates the policy
// already named p.Name to p. updated reports which.
func createOrUpdatePolicy(c *consul.ACL, p *consul.ACLPolicy, update bool) (out *consul.ACLPolicy, updated bool, err error) {
	if update {
		// NB: the list, not read-by-name: a missing policy and an unknown
		// token are both 403 "ACL not found" there.
		ps, _, err := c.PolicyList(nil)
		if err != nil {
			return nil, false, err
		}
		for _, e := range ps {
			if e.Name == p.Name {
				p.ID = e.ID
				out, _, err := c.PolicyUpdate(p, nil)
				return out, true, err
			}
		}
	}
	out, _, err = c.PolicyCreate(p, nil)
	return out, false, err
}

// createOrUpdateToken creates t, or with update set updates the token whose
// secret is t.SecretID to t's description and links. updated reports
// which.
func createOrUpdateToken(c *consul.ACL, t *consul.ACLToken, update bool) (out *consul.ACLToken, updated bool, err error) {
	if update {
		old, _, err := c.TokenReadSelf(&consul.QueryOptions{Token: t.SecretID})
		var se consul.StatusError
		switch {
		case err == nil:
			if t.AccessorID != "" && t.AccessorID != old.AccessorID {
				return nil, false, fmt.Errorf("a token with this secret exists with accessor %s, not --accessor %s", old.AccessorID, t.AccessorID)
			}
			t.AccessorID, t.SecretID = old.AccessorID, "" // the secret is kept
			out, _, err := c.TokenUpdate(t, nil)
			return out, true, err
		case !errors.As(err, &se) || se.Code != 403 || !strings.Contains(se.Body, "ACL not found"):
			return nil, false, err
		}
	}
	out, _, err = c.TokenCreate(t, nil)
	return out, false, err
}
