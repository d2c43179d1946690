package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

func newKVCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "Read and write keys",
		Long: `Read and write keys.

Every write takes a Raft index; an entry's modify index is the index of the
write that last changed it. Pass it to --cas to write only if nobody changed
the key since you read it (--cas 0: only if the key does not exist).`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(newKVPutCmd(), newKVGetCmd(), newKVDeleteCmd(), newKVListCmd())
	return cmd
}

// casHint is the advice after a failed CAS on key.
func casHint(key string) string {
	return fmt.Sprintf("the key changed since you read it; read its modify_index with 'lodestone kv get %s -o json' and retry with that --cas", key)
}

// jsonKV is an entry as -o json prints it. Values are base64, as in
// Consul's HTTP API and etcdctl's JSON.
type jsonKV struct {
	Key         string  `json:"key"`
	Value       *[]byte `json:"value,omitempty"`
	CreateIndex uint64  `json:"create_index"`
	ModifyIndex uint64  `json:"modify_index"`
	LockIndex   uint64  `json:"lock_index"`
	Flags       uint64  `json:"flags"`
	Session     string  `json:"session,omitempty"`
}

func toJSONKV(kv *lodestonepb.KeyValue, withValue bool) jsonKV {
	j := jsonKV{
		Key:         string(kv.GetKey()),
		CreateIndex: kv.GetCreateIndex(),
		ModifyIndex: kv.GetModifyIndex(),
		LockIndex:   kv.GetLockIndex(),
		Flags:       kv.GetFlags(),
		Session:     kv.GetSession(),
	}
	if withValue {
		v := kv.GetValue()
		if v == nil {
			v = []byte{}
		}
		j.Value = &v
	}
	return j
}

// ---- kv put ----

type kvPutOptions struct {
	Client clientOptions
	Key    string
	Value  string    // "-" reads Stdin
	Stdin  io.Reader // for Value "-"
	Flags  uint64
	CAS    *uint64 // nil: unconditional
	Output string
}

func newKVPutCmd() *cobra.Command {
	var o kvPutOptions
	var cas uint64
	cmd := &cobra.Command{
		Use:   "put KEY VALUE",
		Short: "Write a key (VALUE - reads stdin)",
		Example: `  lodestone kv put greeting hello
  lodestone kv put config/app - < app.json
  lodestone kv put lock/leader me --cas 0     # only if absent`,
		Args: exactArgs("KEY", "VALUE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Client, err = clientFlags(cmd); err != nil {
				return err
			}
			if err := checkOutput(cmd, o.Output); err != nil {
				return err
			}
			o.Key, o.Value, o.Stdin = args[0], args[1], cmd.InOrStdin()
			if cmd.Flags().Changed("cas") {
				o.CAS = &cas
			}
			return runKVPut(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	cmd.Flags().Uint64Var(&o.Flags, "flags", 0, "opaque uint64 stored with the entry")
	cmd.Flags().Uint64Var(&cas, "cas", 0, "write only if the key's modify index is IDX (0: only if absent)")
	addOutputFlag(cmd, &o.Output)
	return cmd
}

func runKVPut(ctx context.Context, o kvPutOptions, w io.Writer) error {
	value := []byte(o.Value)
	if o.Value == "-" {
		var err error
		if value, err = io.ReadAll(o.Stdin); err != nil {
			return fmt.Errorf("read value from stdin: %w: pipe the value in or pass it as an argument", err)
		}
	}
	opts := []client.PutOption{client.WithFlags(o.Flags)}
	if o.CAS != nil {
		opts = append(opts, client.WithCAS(*o.CAS))
	}
	return withClient(ctx, o.Client, func(ctx context.Context, c *client.Client) error {
		resp, err := c.Put(ctx, o.Key, value, opts...)
		if err != nil {
			return explain(err, o.Client, casHint(o.Key))
		}
		return renderKVPut(w, o.Output, o.Key, resp)
	})
}

func renderKVPut(w io.Writer, format, key string, resp *lodestonepb.PutResponse) error {
	kv := resp.GetKv()
	if kv == nil {
		kv = &lodestonepb.KeyValue{Key: []byte(key), ModifyIndex: resp.GetHeader().GetIndex()}
	}
	if format == outputJSON {
		return writeJSON(w, toJSONKV(kv, false))
	}
	_, err := fmt.Fprintf(w, "stored %q at modify index %d\n", key, kv.GetModifyIndex())
	return err
}

// ---- kv get ----

type kvGetOptions struct {
	Client clientOptions
	Key    string
	Stale  bool
	Output string
}

func newKVGetCmd() *cobra.Command {
	var o kvGetOptions
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Print a key's value (-o json: the whole entry)",
		Args:  exactArgs("KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Client, err = clientFlags(cmd); err != nil {
				return err
			}
			if err := checkOutput(cmd, o.Output); err != nil {
				return err
			}
			o.Key = args[0]
			return runKVGet(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&o.Stale, "stale", false, "let any server answer from its own state, without confirming the leader")
	addOutputFlag(cmd, &o.Output)
	return cmd
}

func runKVGet(ctx context.Context, o kvGetOptions, w io.Writer) error {
	var opts []client.ReadOption
	if o.Stale {
		opts = append(opts, client.Stale())
	}
	return withClient(ctx, o.Client, func(ctx context.Context, c *client.Client) error {
		resp, err := c.Get(ctx, o.Key, opts...)
		if err != nil {
			return explain(err, o.Client, "")
		}
		if resp.GetKv() == nil {
			return fmt.Errorf("key %q not found: list keys with 'lodestone kv list'", o.Key)
		}
		return renderKVGet(w, o.Output, resp.GetKv())
	})
}

// renderKVGet prints the value as stored, plus a newline unless it ends
// with one (so text round-trips through put - and get).
func renderKVGet(w io.Writer, format string, kv *lodestonepb.KeyValue) error {
	if format == outputJSON {
		return writeJSON(w, toJSONKV(kv, true))
	}
	v := kv.GetValue()
	if _, err := w.Write(v); err != nil {
		return err
	}
	if !bytes.HasSuffix(v, []byte("\n")) {
		_, err := io.WriteString(w, "\n")
		return err
	}
	return nil
}

// ---- kv delete ----

type kvDeleteOptions struct {
	Client clientOptions
	Key    string
	Prefix bool
	CAS    *uint64
	Output string
}

func newKVDeleteCmd() *cobra.Command {
	var o kvDeleteOptions
	var cas uint64
	cmd := &cobra.Command{
		Use:     "delete KEY",
		Aliases: []string{"del", "rm"},
		Short:   "Delete a key, or every key under a prefix",
		Args:    exactArgs("KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Client, err = clientFlags(cmd); err != nil {
				return err
			}
			if err := checkOutput(cmd, o.Output); err != nil {
				return err
			}
			o.Key = args[0]
			if cmd.Flags().Changed("cas") {
				if o.Prefix {
					return usagef(cmd, "--cas cannot be combined with --prefix")
				}
				o.CAS = &cas
			}
			return runKVDelete(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&o.Prefix, "prefix", false, "delete every key that starts with KEY")
	cmd.Flags().Uint64Var(&cas, "cas", 0, "delete only if the key's modify index is IDX")
	addOutputFlag(cmd, &o.Output)
	return cmd
}

func runKVDelete(ctx context.Context, o kvDeleteOptions, w io.Writer) error {
	var opts []client.DeleteOption
	if o.Prefix {
		opts = append(opts, client.Prefix())
	}
	if o.CAS != nil {
		opts = append(opts, client.DeleteCAS(*o.CAS))
	}
	return withClient(ctx, o.Client, func(ctx context.Context, c *client.Client) error {
		resp, err := c.Delete(ctx, o.Key, opts...)
		if err != nil {
			return explain(err, o.Client, casHint(o.Key))
		}
		return renderKVDelete(w, o.Output, resp)
	})
}

func renderKVDelete(w io.Writer, format string, resp *lodestonepb.DeleteResponse) error {
	if format == outputJSON {
		return writeJSON(w, struct {
			Deleted uint64 `json:"deleted"`
			Index   uint64 `json:"index"`
		}{resp.GetDeleted(), resp.GetHeader().GetIndex()})
	}
	noun := "keys"
	if resp.GetDeleted() == 1 {
		noun = "key"
	}
	_, err := fmt.Fprintf(w, "deleted %d %s\n", resp.GetDeleted(), noun)
	return err
}

// ---- kv list ----

type kvListOptions struct {
	Client   clientOptions
	Prefix   string
	KeysOnly bool
	Limit    uint32 // 0: every key, fetched page by page
	Stale    bool
	Output   string
}

func newKVListCmd() *cobra.Command {
	var o kvListOptions
	cmd := &cobra.Command{
		Use:     "list [PREFIX]",
		Aliases: []string{"ls"},
		Short:   "List keys under a prefix (all keys without one)",
		Args:    rangeArgs(0, "[PREFIX]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Client, err = clientFlags(cmd); err != nil {
				return err
			}
			if err := checkOutput(cmd, o.Output); err != nil {
				return err
			}
			if len(args) == 1 {
				o.Prefix = args[0]
			}
			return runKVList(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&o.KeysOnly, "keys-only", false, "omit values")
	cmd.Flags().Uint32Var(&o.Limit, "limit", 0, "list at most N keys (0: all)")
	cmd.Flags().BoolVar(&o.Stale, "stale", false, "let any server answer from its own state, without confirming the leader")
	addOutputFlag(cmd, &o.Output)
	return cmd
}

func runKVList(ctx context.Context, o kvListOptions, w io.Writer) error {
	return withClient(ctx, o.Client, func(ctx context.Context, c *client.Client) error {
		var (
			kvs   []*lodestonepb.KeyValue
			more  bool
			after string
		)
		// Without --limit, page through the server's maximum per answer.
		for {
			opts := []client.RangeOption{client.Limit(o.Limit)}
			if o.KeysOnly {
				opts = append(opts, client.KeysOnly())
			}
			if o.Stale {
				opts = append(opts, client.Stale())
			}
			if after != "" {
				opts = append(opts, client.StartAfter(after))
			}
			resp, err := c.Range(ctx, o.Prefix, opts...)
			if err != nil {
				return explain(err, o.Client, "")
			}
			kvs = append(kvs, resp.GetKvs()...)
			more = resp.GetMore()
			if o.Limit > 0 || !more || len(resp.GetKvs()) == 0 {
				break
			}
			after = string(resp.GetKvs()[len(resp.GetKvs())-1].GetKey())
		}
		return renderKVList(w, o.Output, kvs, o.KeysOnly, more)
	})
}

// renderKVList prints entries as a table (KEY, FLAGS, MODIFY-INDEX and a
// VALUE preview unless keysOnly) or as JSON {"kvs": [...], "more": bool}.
// more says --limit cut the list short.
func renderKVList(w io.Writer, format string, kvs []*lodestonepb.KeyValue, keysOnly, more bool) error {
	if format == outputJSON {
		out := struct {
			KVs  []jsonKV `json:"kvs"`
			More bool     `json:"more"`
		}{KVs: make([]jsonKV, 0, len(kvs)), More: more}
		for _, kv := range kvs {
			out.KVs = append(out.KVs, toJSONKV(kv, !keysOnly))
		}
		return writeJSON(w, out)
	}
	tw := newTable(w)
	if keysOnly {
		tw.row("KEY", "FLAGS", "MODIFY-INDEX")
	} else {
		tw.row("KEY", "FLAGS", "MODIFY-INDEX", "VALUE")
	}
	for _, kv := range kvs {
		if keysOnly {
			tw.row(cell(string(kv.GetKey())), kv.GetFlags(), kv.GetModifyIndex())
		} else {
			tw.row(cell(string(kv.GetKey())), kv.GetFlags(), kv.GetModifyIndex(), preview(kv.GetValue()))
		}
	}
	if err := tw.flush(); err != nil {
		return err
	}
	if more {
		_, err := fmt.Fprintf(w, "(more keys after %q; raise --limit or drop it to list all)\n", string(kvs[len(kvs)-1].GetKey()))
		return err
	}
	return nil
}

// previewRunes is how much of a value a table shows.
const previewRunes = 40

// preview renders a value for one table cell: text as is (quoted if it
// holds control characters or tabs), cut to previewRunes; binary as its
// size.
func preview(v []byte) string {
	if !utf8.Valid(v) {
		return fmt.Sprintf("<%d bytes, binary>", len(v))
	}
	s := string(v)
	cut := false
	if utf8.RuneCountInString(s) > previewRunes {
		s = string([]rune(s)[:previewRunes])
		cut = true
	}
	if strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		s = strconv.Quote(s)
	}
	if cut {
		s += "…"
	}
	return s
}

// cell makes a key safe for a table cell.
func cell(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) || s == "" {
		return strconv.Quote(s)
	}
	return s
}
