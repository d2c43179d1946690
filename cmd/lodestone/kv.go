package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	cmd.AddCommand(newKVPutCmd(), newKVGetCmd(), newKVDeleteCmd(), newKVListCmd(), newKVWatchCmd())
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
			if o.Client, err = clientOutputFlags(cmd, o.Output); err != nil {
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
			if o.Client, err = clientOutputFlags(cmd, o.Output); err != nil {
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
			if o.Client, err = clientOutputFlags(cmd, o.Output); err != nil {
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
			if o.Client, err = clientOutputFlags(cmd, o.Output); err != nil {
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

// ---- kv watch ----

type kvWatchOptions struct {
	Client    clientOptions
	Key       string
	Exact     bool   // watch Key only, not every key under it
	FromIndex uint64 // 0: from now
	KeysOnly  bool
	Output    string
	From      string // --from: followers or leader
}

func newKVWatchCmd() *cobra.Command {
	var o kvWatchOptions
	cmd := &cobra.Command{
		Use:   "watch PREFIX",
		Short: "Print every change under a prefix as it happens, until Ctrl-C",
		Long: `Print every change under a prefix as it happens, until Ctrl-C.

Each change is one line: the event type (put or delete), the key, its modify
index (the Raft index of the change) and a preview of the value. With -o json each change is
one JSON object per line (values in base64). The watch survives a server
restart or a leader change: it resumes where it was, with no change missed
or printed twice. It fails when no server served it for --timeout.

To follow a key from a known state, read it and pass the modify index you
read to --from-index: every change after that index is printed, including
those that happened before the command started (as long as the servers
still retain them).

The watch streams from a follower (--from followers, the default), so that
its fan-out does not load the leader, which every write goes through; every
member delivers the same changes in the same order. --from leader streams
from the leader instead.`,
		Example: `  lodestone kv watch svc/web/
  lodestone kv watch config/app --exact -o json
  lodestone kv watch svc/ --from-index 1200`,
		Args: exactArgs("PREFIX"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.Client, err = clientOutputFlags(cmd, o.Output); err != nil {
				return err
			}
			o.Key = args[0]
			if o.Exact && o.Key == "" {
				return usagef(cmd, "--exact needs a non-empty key")
			}
			if o.Client.WatchFrom, err = client.ParseWatchFrom(o.From); err != nil {
				return usagef(cmd, "--from: %v", err)
			}
			return runKVWatch(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&o.Exact, "exact", false, "watch only the key PREFIX itself, not the keys under it")
	cmd.Flags().BoolVar(&o.Exact, "key-only-exact", false, "same as --exact")
	_ = cmd.Flags().MarkHidden("key-only-exact")
	cmd.Flags().Uint64Var(&o.FromIndex, "from-index", 0, "print every change after modify index N, also past ones (0: from now)")
	cmd.Flags().BoolVar(&o.KeysOnly, "keys-only", false, "omit values")
	cmd.Flags().StringVar(&o.From, "from", client.WatchFromFollowers.String(), "member to stream from: followers or leader")
	addOutputFlag(cmd, &o.Output)
	return cmd
}

// runKVWatch prints events until ctx ends (Ctrl-C: success) or the watch
// fails. Unlike one-shot commands it has no overall deadline: --timeout
// bounds how long it may go without a server serving it.
func runKVWatch(ctx context.Context, o kvWatchOptions, w io.Writer) error {
	c, err := newClient(o.Client)
	if err != nil {
		return err
	}
	defer c.Close()
	opts := []client.WatchOption{client.FromIndex(o.FromIndex), client.WatchGiveUpAfter(o.Client.Timeout)}
	if !o.Exact {
		opts = append(opts, client.WatchPrefix())
	}
	watch := c.Watch(ctx, o.Key, opts...)
	defer watch.Close()
	for {
		b, err := watch.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted: the normal way to stop
			}
			return explainWatch(err, o)
		}
		for _, ev := range b.Events {
			if err := renderWatchEvent(w, o.Output, ev, o.KeysOnly); err != nil {
				return err
			}
		}
	}
}

// explainWatch attaches what to do to a watch's terminal error.
func explainWatch(err error, o kvWatchOptions) error {
	var ce *client.CompactedError
	switch {
	case errors.As(err, &ce):
		return &hintError{err: err, hint: fmt.Sprintf(
			"the servers no longer retain changes after index %d; read the current state with 'lodestone kv list %s' and watch without --from-index (or with a newer one)",
			ce.Requested, o.Key)}
	case errors.Is(err, client.ErrWatchCanceled):
		return &hintError{err: err, hint: "the server refused the watch; fix the key or retry later"}
	}
	return explain(err, o.Client, "")
}

// jsonEvent is one event as -o json prints it: the type and the entry's
// fields, on one line.
type jsonEvent struct {
	Type string `json:"type"`
	jsonKV
}

// renderWatchEvent prints one event: "<type> <key> index=<modify index>
// <value preview>" (type padded to the width of "delete"; no value for
// deletes or with keysOnly), or one JSON object per line.
func renderWatchEvent(w io.Writer, format string, ev *lodestonepb.Event, keysOnly bool) error {
	typ := "put"
	if ev.GetType() == lodestonepb.Event_DELETE {
		typ = "delete"
	}
	kv := ev.GetKv()
	withValue := typ == "put" && !keysOnly
	if format == outputJSON {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		return enc.Encode(jsonEvent{Type: typ, jsonKV: toJSONKV(kv, withValue)})
	}
	line := fmt.Sprintf("%-6s %s index=%d", typ, cell(string(kv.GetKey())), kv.GetModifyIndex())
	if withValue {
		line += " " + preview(kv.GetValue())
	}
	_, err := io.WriteString(w, strings.TrimRight(line, " ")+"\n")
	return err
}
