package consulapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
)

// kvEntry is Consul's JSON for one KV pair (api.KVPair).
type kvEntry struct {
	LockIndex   uint64
	Key         string
	Flags       uint64
	Value       []byte // base64 in JSON, null when empty, as Consul
	CreateIndex uint64
	ModifyIndex uint64
	Session     string `json:",omitempty"`
}

func toEntry(kv *lodestonepb.KeyValue) kvEntry {
	e := kvEntry{
		LockIndex: kv.LockIndex, Key: string(kv.Key), Flags: kv.Flags,
		CreateIndex: kv.CreateIndex, ModifyIndex: kv.ModifyIndex, Session: kv.Session,
	}
	if len(kv.Value) > 0 {
		e.Value = kv.Value
	}
	return e
}

func (a *API) kv(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimPrefix(r.URL.Path, "/v1/kv/")
	// NB: a token nobody issued is refused before the body is read.
	az, err := a.authorizer(r)
	switch {
	case err != nil:
	case r.Method == http.MethodGet:
		err = a.kvGet(w, r, az, key)
	case r.Method == http.MethodPut:
		err = a.kvPut(w, r, key)
	case r.Method == http.MethodDelete:
		err = a.kvDelete(w, r, key)
	default:
		w.Header().Set("Allow", "GET, PUT, DELETE")
		err = &httpError{http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on /v1/kv/; use GET, PUT or DELETE", r.Method)}
	}
	if err != nil {
		a.writeError(w, r, err)
	}
}

func (a *API) kvGet(w http.ResponseWriter, r *http.Request, az *acl.Authorizer, key string) error {
	q, err := a.parseQuery(r)
	if err != nil {
		return err
	}
	v := q.params
	recurse, keys, raw := v.Has("recurse"), v.Has("keys"), v.Has("raw")
	prefix := recurse || keys
	if !prefix && key == "" {
		return badRequest("Missing key name")
	}
	if !prefix {
		if err := az.Check(acl.ResourceKey, key, acl.AccessRead); err != nil {
			return err
		}
	}
	st := a.b.Store()
	d := KVDep(key, prefix)
	if err := a.blockOn(w, r, q, d, a.kvResume); err != nil {
		return err
	}
	if err := a.read(r.Context(), q); err != nil {
		return err
	}
	// NB: one conversion for the index and the read: a leader answers
	// thousands of these a second, and each is an allocation.
	keyBytes := []byte(key)
	// NB: the index before the data (store.KVIndexFor); d.IndexIn, for
	// the KVDep d is.
	index := st.KVIndexFor(keyBytes, prefix)
	a.setMeta(w, index)

	if !prefix {
		kv, _ := st.Get(keyBytes)
		if kv == nil {
			w.WriteHeader(http.StatusNotFound)
			return nil
		}
		if raw {
			w.Header().Set("Content-Type", "application/octet-stream")
			_, err := w.Write(kv.Value)
			return err
		}
		writeKVPair(w, kv)
		return nil
	}

	all, err := a.rangeAll([]byte(key), keys)
	if err != nil {
		return err
	}
	kvs := acl.FilterKVs(az, all)
	if keys {
		sep := v.Get("separator")
		out := keyList(kvs, key, sep)
		if len(out) == 0 {
			w.WriteHeader(http.StatusNotFound)
			return nil
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	if len(kvs) == 0 {
		w.WriteHeader(http.StatusNotFound)
		return nil
	}
	out := make([]kvEntry, len(kvs))
	for i, kv := range kvs {
		out[i] = toEntry(kv)
	}
	writeKVEntries(w, out)
	return nil
}

// rangeAll pages through every key under prefix, up to MaxRangeBytes of
// keys and values (of keys alone with keysOnly); past that it is a 413.
func (a *API) rangeAll(prefix []byte, keysOnly bool) ([]*lodestonepb.KeyValue, error) {
	st := a.b.Store()
	limit := a.b.Limits().RangeLimit(0)
	var out []*lodestonepb.KeyValue
	var after []byte
	size := 0
	for {
		kvs, more, _ := st.Range(prefix, after, limit, keysOnly)
		for _, kv := range kvs {
			size += len(kv.Key) + len(kv.Value)
		}
		if max := a.b.BodyLimits().MaxRangeBytes; max > 0 && size > max {
			what := "keys and values"
			if keysOnly {
				what = "keys"
			}
			return nil, a.tooLarge("max-range-response-bytes",
				"Response too large: more than %d bytes of %s under %q (limit max-range-response-bytes); page with ?keys&separator=/ or a narrower prefix", max, what, prefix)
		}
		out = append(out, kvs...)
		if !more || len(kvs) == 0 {
			return out, nil
		}
		after = kvs[len(kvs)-1].Key
	}
}

// keyList is Consul's ?keys answer: with a separator, keys deeper than the
// first separator after the prefix fold into one "dir/" entry.
func keyList(kvs []*lodestonepb.KeyValue, prefix, sep string) []string {
	seen := map[string]bool{}
	out := []string{}
	for _, kv := range kvs {
		k := string(kv.Key)
		if sep != "" {
			if i := strings.Index(k[len(prefix):], sep); i >= 0 {
				k = k[:len(prefix)+i+len(sep)]
			}
		}
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func parseUintParam(v Params, name string) (val uint64, set bool, err error) {
	s, ok := v.Lookup(name)
	if !ok {
		return 0, false, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, true, badRequest("Invalid %s %q: must be a non-negative integer", name, s)
	}
	return n, true, nil
}

func (a *API) kvPut(w http.ResponseWriter, r *http.Request, key string) error {
	if key == "" {
		return badRequest("Missing key name")
	}
	v := Query(r.URL)
	flags, _, err := parseUintParam(v, "flags")
	if err != nil {
		return err
	}
	cas, hasCAS, err := parseUintParam(v, "cas")
	if err != nil {
		return err
	}
	acquire, release := v.Get("acquire"), v.Get("release")
	if v.Has("acquire") && acquire == "" {
		return badRequest("?acquire needs a session id")
	}
	if v.Has("release") && release == "" {
		return badRequest("?release needs a session id")
	}
	if acquire != "" && release != "" {
		return badRequest("Conflicting flags: ?acquire and ?release; use one")
	}
	limit := int64(a.b.Limits().MaxValueBytes)
	if r.ContentLength > limit {
		return a.tooLarge("max-value-bytes", "Request body(%d bytes) too large, max size: %d bytes (limit max-value-bytes)", r.ContentLength, limit)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return badRequest("read request body: %v", err)
	}
	if int64(len(body)) > limit {
		return a.tooLarge("max-value-bytes", "Value exceeds %d byte limit (limit max-value-bytes)", limit)
	}
	put := &lodestonepb.PutRequest{Key: []byte(key), Value: body, Flags: flags}
	if hasCAS {
		put.Cas = &cas
	}
	switch {
	case acquire != "":
		put.Session, put.Acquire = acquire, true
	case release != "":
		put.Session, put.Release = release, true
	}
	res, _, err := a.apply(r, &lodestonepb.Command{Op: &lodestonepb.Command_Put{Put: put}})
	if rejected(err, store.RejectSessionMissing) {
		// Consul: acquiring with an unknown session is an error, not false.
		return consulError("Invalid session %q", put.Session)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, !res.CasFailed && !res.LockFailed)
	return nil
}

func (a *API) kvDelete(w http.ResponseWriter, r *http.Request, key string) error {
	v := Query(r.URL)
	recurse := v.Has("recurse")
	if key == "" && !recurse {
		return badRequest("Missing key name")
	}
	cas, hasCAS, err := parseUintParam(v, "cas")
	if err != nil {
		return err
	}
	if recurse && key == "" {
		return badRequest("deleting every key (recurse with an empty prefix) is refused; name a prefix")
	}
	del := &lodestonepb.DeleteRequest{Key: []byte(key), Prefix: recurse}
	if hasCAS {
		del.Cas = &cas
	}
	res, _, err := a.apply(r, &lodestonepb.Command{Op: &lodestonepb.Command_Delete{Delete: del}})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, !res.CasFailed)
	return nil
}

// txnOp is Consul's JSON for one transaction operation (api.TxnOp): KV,
// or a node, service or check operation (txn_catalog.go).
type txnOp struct {
	KV      *txnKVOp
	Node    *txnNodeOp
	Service *txnServiceOp
	Check   *txnCheckOp
}

type txnKVOp struct {
	Verb    string
	Key     string
	Value   []byte
	Flags   uint64
	Index   uint64
	Session string
}

var txnVerbs = map[string]lodestonepb.TxnOp_Verb{
	"set":              lodestonepb.TxnOp_SET,
	"get":              lodestonepb.TxnOp_GET,
	"delete":           lodestonepb.TxnOp_DELETE,
	"delete-tree":      lodestonepb.TxnOp_DELETE_PREFIX,
	"cas":              lodestonepb.TxnOp_CAS,
	"check-index":      lodestonepb.TxnOp_CHECK_INDEX,
	"check-not-exists": lodestonepb.TxnOp_CHECK_NOT_EXISTS,
	"delete-cas":       lodestonepb.TxnOp_DELETE_CAS,
	"lock":             lodestonepb.TxnOp_LOCK,
	"unlock":           lodestonepb.TxnOp_UNLOCK,
	"check-session":    lodestonepb.TxnOp_CHECK_SESSION,
}

// pb is the store's form of a KV operation.
func (k *txnKVOp) pb() (*lodestonepb.TxnOp, error) {
	verb, ok := txnVerbs[k.Verb]
	if !ok {
		return nil, fmt.Errorf("unknown or unsupported KV verb %q", k.Verb)
	}
	o := &lodestonepb.TxnOp{Verb: verb, Key: []byte(k.Key), Value: k.Value, Flags: k.Flags, Index: k.Index}
	switch verb {
	case lodestonepb.TxnOp_LOCK, lodestonepb.TxnOp_UNLOCK, lodestonepb.TxnOp_CHECK_SESSION:
		o.Session = k.Session
	}
	return o, nil
}

type txnResult struct {
	KV *kvEntry `json:",omitempty"`
}

type txnError struct {
	OpIndex int
	What    string
}

func (a *API) txn(w http.ResponseWriter, r *http.Request) {
	// NB: a token nobody issued is refused before the body is read.
	_, err := a.authorizer(r)
	if err == nil {
		err = a.doTxn(w, r)
	}
	if err != nil {
		a.writeError(w, r, err)
	}
}

func (a *API) doTxn(w http.ResponseWriter, r *http.Request) error {
	// NB: bounded before it is read, as Consul's txn_max_req_len: by its
	// Content-Length when it has one, else by reading one byte past it.
	max := int64(a.b.BodyLimits().MaxTxnBytes)
	if max <= 0 {
		max = DefaultMaxTxnBytes
	}
	if r.ContentLength > max {
		return a.tooLarge("max-txn-request-bytes",
			"Request body(%d bytes) too large, max size: %d bytes (limit max-txn-request-bytes)", r.ContentLength, max)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		return badRequest("read request body: %v", err)
	}
	if int64(len(body)) > max {
		return a.tooLarge("max-txn-request-bytes",
			"Request body too large, max size: %d bytes (limit max-txn-request-bytes)", max)
	}
	var ops []txnOp
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&ops); err != nil {
		return badRequest("Failed to parse body: %v", err)
	}
	if max := a.b.Limits().MaxTxnOps; max > 0 && len(ops) > max {
		// NB: Consul's code and words.
		return a.tooLarge("max-txn-ops", "Transaction contains too many operations (%d > %d)", len(ops), max)
	}
	if slices.ContainsFunc(ops, func(op txnOp) bool { return op.KV == nil }) {
		return a.catalogTxn(w, r, ops) // txn_catalog.go
	}
	pbOps, errs := convertTxnOps(ops, func(op txnOp) (*lodestonepb.TxnOp, error) { return op.KV.pb() })
	if len(errs) > 0 {
		writeTxnErrors(w, errs)
		return nil
	}
	req := &lodestonepb.TxnRequest{Ops: pbOps}
	res, index, err := a.apply(r, &lodestonepb.Command{Op: &lodestonepb.Command_Txn{Txn: req}})
	if err != nil {
		return err
	}
	a.setMeta(w, index)
	out := res.GetTxn()
	if !out.GetSucceeded() {
		writeTxnErrors(w, txnErrorsOf(out.GetErrors()))
		return nil
	}
	results := make([]txnResult, len(out.Results))
	for i, tr := range out.Results {
		if tr.Kv != nil {
			e := toEntry(tr.Kv)
			results[i].KV = &e
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"Results": results, "Errors": nil})
	return nil
}

// convertTxnOps converts every op with conv; the ops it refuses come back
// as the errors of a 409 answer, by index.
func convertTxnOps[T any](ops []txnOp, conv func(txnOp) (T, error)) ([]T, []txnError) {
	out := make([]T, len(ops))
	var errs []txnError
	for i, op := range ops {
		o, err := conv(op)
		if err != nil {
			errs = append(errs, txnError{i, err.Error()})
			continue
		}
		out[i] = o
	}
	return out, errs
}

// txnErrorsOf are the errors of a transaction the store refused.
func txnErrorsOf(es []*lodestonepb.TxnError) []txnError {
	out := make([]txnError, len(es))
	for i, e := range es {
		out[i] = txnError{int(e.OpIndex), e.What}
	}
	return out
}

// writeTxnErrors answers a refused transaction as Consul does: 409 with
// the errors and no results.
func writeTxnErrors(w http.ResponseWriter, errs []txnError) {
	writeJSON(w, http.StatusConflict, map[string]any{"Results": nil, "Errors": errs})
}
