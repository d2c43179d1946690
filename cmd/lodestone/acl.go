package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	consul "github.com/hashicorp/consul/api"
	"github.com/spf13/cobra"
)

// The `lodestone acl` commands, as `consul acl`: they talk to the HTTP
// API with the official Consul client, so they work against Consul too.

const (
	envHTTPAddr        = "LODESTONE_HTTP_ADDR"
	defaultHTTPAddress = "127.0.0.1:8500"
)

func newACLCmd(getenv func(string) string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "acl",
		Short: "Manage ACL tokens, policies and roles",
		Long: `Manage ACL tokens, policies and roles through the Consul-compatible HTTP
API, as "consul acl" does. Start with "lodestone acl bootstrap" to get the
first management token.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	addr := defaultHTTPAddress
	if env := strings.TrimSpace(getenv(envHTTPAddr)); env != "" {
		addr = env
	}
	pf := cmd.PersistentFlags()
	pf.String("http-addr", addr, "a server's HTTP address (env "+envHTTPAddr+")")
	pf.String("format", "table", "output format: table or json")
	a := &aclCLI{}
	cmd.AddCommand(a.bootstrapCmd(), a.policyCmd(), a.roleCmd(), a.tokenCmd())
	return cmd
}

type aclCLI struct{}

// client builds the Consul client from the flags and checks --format.
func (a *aclCLI) client(cmd *cobra.Command) (*consul.ACL, string, error) {
	format, _ := cmd.Flags().GetString("format")
	if format != "table" && format != "json" {
		return nil, "", usagef(cmd, "--format %q: use table or json", format)
	}
	tok, err := tokenOf(cmd)
	if err != nil {
		return nil, "", err
	}
	tlsCfg, err := clientTLS(cmd)
	if err != nil {
		return nil, "", err
	}
	cfg := consul.DefaultNonPooledConfig()
	cfg.Address, _ = cmd.Flags().GetString("http-addr")
	cfg.Token = tok
	if tlsCfg != nil {
		// NB: the same TLS material as every other command (--ca-file,
		// --cert-file, --key-file), so HTTPS with a bare host:port.
		cfg.Transport = &http.Transport{TLSClientConfig: tlsCfg}
		if !strings.Contains(cfg.Address, "://") {
			cfg.Scheme = "https"
		}
	}
	c, err := consul.NewClient(cfg)
	if err != nil {
		return nil, "", err
	}
	return c.ACL(), format, nil
}

// serverErr turns the client's "Unexpected response code" into the
// server's own text, which names the missing permission.
func serverErr(err error) error {
	var se consul.StatusError
	if errors.As(err, &se) && strings.TrimSpace(se.Body) != "" {
		return fmt.Errorf("%s (HTTP %d)", strings.TrimSpace(se.Body), se.Code)
	}
	return err
}

// leaf builds a subcommand that runs with a client built from the flags.
func (a *aclCLI) leaf(use, short string, run func(cmd *cobra.Command, acl *consul.ACL, format string) error) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, format, err := a.client(cmd)
			if err != nil {
				return err
			}
			return serverErr(run(cmd, c, format))
		}}
}

// readRules reads --rules: @file, - for stdin, or the rules inline.
func readRules(cmd *cobra.Command, v string) (string, error) {
	switch {
	case v == "-":
		b, err := io.ReadAll(cmd.InOrStdin())
		return string(b), err
	case strings.HasPrefix(v, "@"):
		b, err := os.ReadFile(v[1:])
		if err != nil {
			return "", fmt.Errorf("read --rules: %w", err)
		}
		return string(b), nil
	}
	return v, nil
}

func (a *aclCLI) policyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Create, list, read, update and delete policies", Args: cobra.ArbitraryArgs, RunE: groupRunE}
	var name, rules, desc, id string
	var updatePolicy bool
	create := a.leaf("create --name N --rules @file|-|RULES [--description D] [--update-existing]", "Create a policy", func(cmd *cobra.Command, c *consul.ACL, format string) error {
		if name == "" || rules == "" {
			return usagef(cmd, "--name and --rules are required")
		}
		text, err := readRules(cmd, rules)
		if err != nil {
			return err
		}
		p, updated, err := createOrUpdatePolicy(c, &consul.ACLPolicy{Name: name, Rules: text, Description: desc}, updatePolicy)
		if err != nil {
			return err
		}
		if updated {
			fmt.Fprintf(cmd.ErrOrStderr(), "Policy %q existed: updated it\n", name)
		}
		return printPolicy(cmd.OutOrStdout(), format, p)
	})
	create.Flags().StringVar(&name, "name", "", "policy name (required)")
	create.Flags().StringVar(&rules, "rules", "", "rules: @file, - for stdin, or inline (required)")
	create.Flags().StringVar(&desc, "description", "", "description")
	create.Flags().BoolVar(&updatePolicy, "update-existing", false, "if a policy with this name exists, update its rules and description instead of failing")

	find := func(c *consul.ACL, id, name string) (*consul.ACLPolicy, error) {
		if id != "" {
			p, _, err := c.PolicyRead(id, nil)
			return p, err
		}
		p, _, err := c.PolicyReadByName(name, nil)
		if err == nil && p == nil {
			err = fmt.Errorf("no policy named %q", name)
		}
		return p, err
	}
	var rid, rname string
	read := a.leaf("read --id ID | --name N", "Show a policy", func(cmd *cobra.Command, c *consul.ACL, format string) error {
		if (rid == "") == (rname == "") {
			return usagef(cmd, "give exactly one of --id and --name")
		}
		p, err := find(c, rid, rname)
		if err != nil {
			return err
		}
		return printPolicy(cmd.OutOrStdout(), format, p)
	})
	read.Flags().StringVar(&rid, "id", "", "policy id")
	read.Flags().StringVar(&rname, "name", "", "policy name")

	var uname, urules, udesc string
	update := a.leaf("update --id ID [--name N] [--rules R] [--description D]", "Change a policy", func(cmd *cobra.Command, c *consul.ACL, format string) error {
		if id == "" {
			return usagef(cmd, "--id is required")
		}
		p, _, err := c.PolicyRead(id, nil)
		if err != nil {
			return err
		}
		if uname != "" {
			p.Name = uname
		}
		if cmd.Flags().Changed("description") {
			p.Description = udesc
		}
		if urules != "" {
			if p.Rules, err = readRules(cmd, urules); err != nil {
				return err
			}
		}
		p, _, err = c.PolicyUpdate(p, nil)
		if err != nil {
			return err
		}
		return printPolicy(cmd.OutOrStdout(), format, p)
	})
	update.Flags().StringVar(&id, "id", "", "policy id (required)")
	update.Flags().StringVar(&uname, "name", "", "new name")
	update.Flags().StringVar(&urules, "rules", "", "new rules: @file, - or inline")
	update.Flags().StringVar(&udesc, "description", "", "new description")

	var did, dname string
	del := a.leaf("delete --id ID | --name N", "Delete a policy", func(cmd *cobra.Command, c *consul.ACL, _ string) error {
		if (did == "") == (dname == "") {
			return usagef(cmd, "give exactly one of --id and --name")
		}
		p, err := find(c, did, dname)
		if err != nil {
			return err
		}
		if _, err := c.PolicyDelete(p.ID, nil); err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "Policy %q deleted successfully\n", p.Name)
		return nil
	})
	del.Flags().StringVar(&did, "id", "", "policy id")
	del.Flags().StringVar(&dname, "name", "", "policy name")

	list := a.leaf("list", "List policies", func(cmd *cobra.Command, c *consul.ACL, format string) error {
		ps, _, err := c.PolicyList(nil)
		if err != nil {
			return err
		}
		w := cmd.OutOrStdout()
		if format == "json" {
			return writeJSON(w, ps)
		}
		t := newTable(w)
		t.row("ID", "NAME", "DESCRIPTION")
		for _, p := range ps {
			t.row(p.ID, p.Name, dash(p.Description))
		}
		return t.flush()
	})
	cmd.AddCommand(create, list, read, update, del)
	return cmd
}

func (a *aclCLI) roleCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "role", Short: "Create, list, read and delete roles", Args: cobra.ArbitraryArgs, RunE: groupRunE}
	var name, desc string
	var pnames, pids []string
	create := a.leaf("create --name N [--policy-name P]... [--policy-id ID]...", "Create a role", func(cmd *cobra.Command, c *consul.ACL, format string) error {
		if name == "" {
			return usagef(cmd, "--name is required")
		}
		ro := &consul.ACLRole{Name: name, Description: desc}
		for _, n := range pnames {
			ro.Policies = append(ro.Policies, &consul.ACLRolePolicyLink{Name: n})
		}
		for _, id := range pids {
			ro.Policies = append(ro.Policies, &consul.ACLRolePolicyLink{ID: id})
		}
		ro, _, err := c.RoleCreate(ro, nil)
		if err != nil {
			return err
		}
		return printRole(cmd.OutOrStdout(), format, ro)
	})
	create.Flags().StringVar(&name, "name", "", "role name (required)")
	create.Flags().StringVar(&desc, "description", "", "description")
	create.Flags().StringArrayVar(&pnames, "policy-name", nil, "link a policy by name (repeatable)")
	create.Flags().StringArrayVar(&pids, "policy-id", nil, "link a policy by id (repeatable)")

	find := func(c *consul.ACL, id, name string) (*consul.ACLRole, error) {
		var ro *consul.ACLRole
		var err error
		if id != "" {
			ro, _, err = c.RoleRead(id, nil)
		} else {
			ro, _, err = c.RoleReadByName(name, nil)
		}
		if err == nil && ro == nil {
			err = fmt.Errorf("no such role %s%s", id, name)
		}
		return ro, err
	}
	var rid, rname string
	read := a.leaf("read --id ID | --name N", "Show a role", func(cmd *cobra.Command, c *consul.ACL, format string) error {
		if (rid == "") == (rname == "") {
			return usagef(cmd, "give exactly one of --id and --name")
		}
		ro, err := find(c, rid, rname)
		if err != nil {
			return err
		}
		return printRole(cmd.OutOrStdout(), format, ro)
	})
	read.Flags().StringVar(&rid, "id", "", "role id")
	read.Flags().StringVar(&rname, "name", "", "role name")
	var did, dname string
	del := a.leaf("delete --id ID | --name N", "Delete a role", func(cmd *cobra.Command, c *consul.ACL, _ string) error {
		if (did == "") == (dname == "") {
			return usagef(cmd, "give exactly one of --id and --name")
		}
		ro, err := find(c, did, dname)
		if err != nil {
			return err
		}
		if _, err := c.RoleDelete(ro.ID, nil); err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "Role %q deleted successfully\n", ro.Name)
		return nil
	})
	del.Flags().StringVar(&did, "id", "", "role id")
	del.Flags().StringVar(&dname, "name", "", "role name")
	list := a.leaf("list", "List roles", func(cmd *cobra.Command, c *consul.ACL, format string) error {
		rs, _, err := c.RoleList(nil)
		if err != nil {
			return err
		}
		w := cmd.OutOrStdout()
		if format == "json" {
			return writeJSON(w, rs)
		}
		t := newTable(w)
		t.row("ID", "NAME", "POLICIES")
		for _, ro := range rs {
			t.row(ro.ID, ro.Name, linkNames(ro.Policies))
		}
		return t.flush()
	})
	cmd.AddCommand(create, list, read, del)
	return cmd
}

// tokenLinkFlags are the link flags of token create and update.
type tokenLinkFlags struct {
	desc, secret, accessor     string
	pnames, pids, rnames, rids []string
}

func (f *tokenLinkFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.desc, "description", "", "description")
	fl.StringArrayVar(&f.pnames, "policy-name", nil, "link a policy by name (repeatable)")
	fl.StringArrayVar(&f.pids, "policy-id", nil, "link a policy by id (repeatable)")
	fl.StringArrayVar(&f.rnames, "role-name", nil, "link a role by name (repeatable)")
	fl.StringArrayVar(&f.rids, "role-id", nil, "link a role by id (repeatable)")
}

func (f *tokenLinkFlags) links() (ps []*consul.ACLLink, rs []*consul.ACLLink) {
	for _, n := range f.pnames {
		ps = append(ps, &consul.ACLLink{Name: n})
	}
	for _, id := range f.pids {
		ps = append(ps, &consul.ACLLink{ID: id})
	}
	for _, n := range f.rnames {
		rs = append(rs, &consul.ACLLink{Name: n})
	}
	for _, id := range f.rids {
		rs = append(rs, &consul.ACLLink{ID: id})
	}
	return ps, rs
}

func (a *aclCLI) tokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Create, list, read, update and delete tokens", Args: cobra.ArbitraryArgs, RunE: groupRunE}
	var cf tokenLinkFlags
	var secretFile string
	var updateToken bool
	create := a.leaf("create [--description D] [--policy-name P]... [--role-name R]... [--secret S | --secret-file F] [--update-existing]", "Create a token", func(cmd *cobra.Command, c *consul.ACL, format string) error {
		if cf.secret != "" && secretFile != "" {
			return usagef(cmd, "give at most one of --secret and --secret-file")
		}
		if secretFile != "" {
			var err error
			if cf.secret, err = readSecretArg(cmd, "--secret-file", secretFile); err != nil {
				return err
			}
		}
		if updateToken && cf.secret == "" {
			return usagef(cmd, "--update-existing needs --secret or --secret-file: the secret is what finds the existing token")
		}
		ps, rs := cf.links()
		t, updated, err := createOrUpdateToken(c, &consul.ACLToken{Description: cf.desc, Policies: ps, Roles: rs, SecretID: cf.secret, AccessorID: cf.accessor}, updateToken)
		if err != nil {
			return err
		}
		if updated {
			fmt.Fprintf(cmd.ErrOrStderr(), "Token %s existed: updated its description and links\n", t.AccessorID)
		}
		return printToken(cmd.OutOrStdout(), format, t)
	})
	cf.add(create)
	create.Flags().StringVar(&cf.secret, "secret", "", "preset secret (default: a fresh UUID)")
	create.Flags().StringVar(&secretFile, "secret-file", "", "file holding the preset secret (- for stdin), kept out of the process list")
	create.Flags().StringVar(&cf.accessor, "accessor", "", "preset accessor id (default: a fresh UUID)")
	create.Flags().BoolVar(&updateToken, "update-existing", false, "if a token with this secret exists, update its description and links instead of failing")

	var rid string
	var self bool
	read := a.leaf("read --id ACCESSOR | --self", "Show a token", func(cmd *cobra.Command, c *consul.ACL, format string) error {
		if (rid == "") == !self {
			return usagef(cmd, "give exactly one of --id and --self")
		}
		var t *consul.ACLToken
		var err error
		if self {
			t, _, err = c.TokenReadSelf(nil)
		} else {
			t, _, err = c.TokenRead(rid, nil)
		}
		if err != nil {
			return err
		}
		return printToken(cmd.OutOrStdout(), format, t)
	})
	read.Flags().StringVar(&rid, "id", "", "token accessor id")
	read.Flags().BoolVar(&self, "self", false, "the token this command acts with")

	var uf tokenLinkFlags
	var uid string
	update := a.leaf("update --id ACCESSOR [--description D] [--policy-name P]... [--role-name R]...", "Replace a token's description and links", func(cmd *cobra.Command, c *consul.ACL, format string) error {
		if uid == "" {
			return usagef(cmd, "--id is required")
		}
		t, _, err := c.TokenRead(uid, nil)
		if err != nil {
			return err
		}
		if cmd.Flags().Changed("description") {
			t.Description = uf.desc
		}
		t.Policies, t.Roles = uf.links()
		t.SecretID = ""
		t, _, err = c.TokenUpdate(t, nil)
		if err != nil {
			return err
		}
		return printToken(cmd.OutOrStdout(), format, t)
	})
	uf.add(update)
	update.Flags().StringVar(&uid, "id", "", "token accessor id (required)")

	var did string
	del := a.leaf("delete --id ACCESSOR", "Delete a token", func(cmd *cobra.Command, c *consul.ACL, _ string) error {
		if did == "" {
			return usagef(cmd, "--id is required")
		}
		if _, err := c.TokenDelete(did, nil); err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "Token %q deleted successfully\n", did)
		return nil
	})
	del.Flags().StringVar(&did, "id", "", "token accessor id (required)")

	list := a.leaf("list", "List tokens", func(cmd *cobra.Command, c *consul.ACL, format string) error {
		ts, _, err := c.TokenList(nil)
		if err != nil {
			return err
		}
		w := cmd.OutOrStdout()
		if format == "json" {
			return writeJSON(w, ts)
		}
		t := newTable(w)
		t.row("ACCESSOR", "DESCRIPTION", "POLICIES", "ROLES")
		for _, e := range ts {
			t.row(e.AccessorID, dash(e.Description), linkNames(e.Policies), linkNames(e.Roles))
		}
		return t.flush()
	})
	cmd.AddCommand(create, list, read, update, del)
	return cmd
}

func linkNames(ls []*consul.ACLLink) string {
	var names []string
	for _, l := range ls {
		names = append(names, l.Name)
	}
	return joinOrDash(names)
}

func printToken(w io.Writer, format string, t *consul.ACLToken) error {
	if format == "json" {
		return writeJSON(w, t)
	}
	tw := newTable(w)
	tw.row("AccessorID:", t.AccessorID)
	tw.row("SecretID:", t.SecretID)
	tw.row("Description:", dash(t.Description))
	tw.row("Policies:", linkNames(t.Policies))
	tw.row("Roles:", linkNames(t.Roles))
	return tw.flush()
}

func printPolicy(w io.Writer, format string, p *consul.ACLPolicy) error {
	if format == "json" {
		return writeJSON(w, p)
	}
	tw := newTable(w)
	tw.row("ID:", p.ID)
	tw.row("Name:", p.Name)
	tw.row("Description:", dash(p.Description))
	if err := tw.flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "Rules:\n%s\n", strings.TrimSpace(p.Rules))
	return err
}

func printRole(w io.Writer, format string, r *consul.ACLRole) error {
	if format == "json" {
		return writeJSON(w, r)
	}
	tw := newTable(w)
	tw.row("ID:", r.ID)
	tw.row("Name:", r.Name)
	tw.row("Description:", dash(r.Description))
	tw.row("Policies:", linkNames(r.Policies))
	return tw.flush()
}
