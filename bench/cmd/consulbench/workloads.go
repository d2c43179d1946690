package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/bench/internal/rawhttp"
)

// workload is one kind of request, driven the same way at both systems.
type workload struct {
	name string // run lines and samples: "kv-put", "kv-get", "catalog-register"
	what string // the setup line's description
}

var (
	putWorkload      = workload{"kv-put", "PUT /v1/kv/consulbench/put/<client>/<seq> of a random value, each client its own keys"}
	getWorkload      = workload{"kv-get", "GET /v1/kv/consulbench/get/<n> in the default consistency mode (no ?stale, no ?consistent), n drawn per op from the preloaded keys; every answer checked (one entry, the key's, its base64 value decoded to the right size), every 16th a client makes decoded with encoding/json"}
	registerWorkload = workload{"catalog-register", "PUT /v1/catalog/register of a new node (cb-<client>-<seq>, its own address) with one service instance (web, port 8080)"}
	workloads        = []workload{putWorkload, getWorkload, registerWorkload}
)

// errWrongAnswer marks an op the server answered, but wrongly: it counts
// as failed, never as fast.
var errWrongAnswer = errors.New("wrong answer")

// conns is one keep-alive HTTP/1.1 connection per client (rawhttp), so
// n clients hold exactly n connections to the leader.
type conns []*rawhttp.Conn

func newConns(n int, base string) conns {
	cs := make(conns, n)
	for i := range cs {
		cs[i] = rawhttp.New(base)
	}
	return cs
}

func (cs conns) close() {
	for _, c := range cs {
		c.Close()
	}
}

// fullCheckEvery is how often (in a client's ops) a get's answer is
// decoded with encoding/json and checked in full; every other answer
// gets checkGetAnswer's scan.
const fullCheckEvery = 16

// op is w's operation for harness.Drive: client c sends on cs[c];
// values[c] is the value it puts; a get must find a value of valueSize
// bytes among getKeys preloaded keys.
func (w workload) op(cs conns, values [][]byte, valueSize, getKeys int) harness.Op {
	switch w.name {
	case getWorkload.name:
		// NB: the requests are built once; the clients share them read-only.
		reqs := make([][]byte, getKeys)
		for i := range reqs {
			reqs[i] = rawhttp.AppendRequest(nil, http.MethodGet, cs[0].Addr(), "/v1/kv/"+getKey(i), nil)
		}
		scratch := make([][]byte, len(cs))
		return func(ctx context.Context, client, seq int) error {
			n := int(draw(client, seq) % uint64(getKeys))
			code, body, err := cs[client].Do(ctx, reqs[n])
			if err != nil {
				return err
			}
			if code != http.StatusOK {
				return fmt.Errorf("GET %s: %d: %s", getKey(n), code, bytes.TrimSpace(body[:min(len(body), 512)]))
			}
			if seq%fullCheckEvery == 0 {
				return checkGetJSON(getKey(n), body, valueSize)
			}
			scratch[client], err = checkGetAnswer(scratch[client], getKey(n), body, valueSize)
			return err
		}
	case registerWorkload.name:
		return func(ctx context.Context, client, seq int) error {
			return sendRaw(ctx, cs[client], http.MethodPut, "/v1/catalog/register", registerBody(client, seq))
		}
	default:
		return func(ctx context.Context, client, seq int) error {
			return sendRaw(ctx, cs[client], http.MethodPut, "/v1/kv/"+putKey(client, seq), values[client])
		}
	}
}

// sendRaw makes one request with body on c and fails unless the answer
// is 200 with body true (KV put and catalog register both answer so).
func sendRaw(ctx context.Context, c *rawhttp.Conn, method, path string, body []byte) error {
	code, got, err := c.Do(ctx, c.Request(method, path, body))
	if err != nil {
		return err
	}
	got = bytes.TrimSpace(got[:min(len(got), 512)])
	if code != http.StatusOK {
		return fmt.Errorf("%s %s: %d: %s", method, path, code, got)
	}
	if string(got) != "true" {
		return fmt.Errorf("%w: %s %s answered %q, want true", errWrongAnswer, method, path, got)
	}
	return nil
}

func putKey(client, seq int) string { return fmt.Sprintf("consulbench/put/%03d/%09d", client, seq) }

func getKey(n int) string { return fmt.Sprintf("consulbench/get/%05d", n) }

// drawSeed is fixed so both systems read the same keys in the same order.
var drawSeed = maphash.MakeSeed()

// draw is a well-mixed number from a client and its op number.
func draw(client, seq int) uint64 {
	var h maphash.Hash
	h.SetSeed(drawSeed)
	var b [16]byte
	for i := range 8 {
		b[i] = byte(uint64(client) >> (8 * i))
		b[8+i] = byte(uint64(seq) >> (8 * i))
	}
	h.Write(b[:])
	return h.Sum64()
}

// registration is the body of a catalog register: what a node agent
// sends when a machine joins with one service on it.
type registration struct {
	Node    string
	Address string
	Service struct {
		ID      string
		Service string
		Port    int
	}
}

// registerBody registers node cb-<client>-<seq> with a web instance; the
// address is unique per op so no registration repeats another.
func registerBody(client, seq int) []byte {
	var r registration
	r.Node = fmt.Sprintf("cb-%03d-%09d", client, seq)
	r.Address = fmt.Sprintf("10.%d.%d.%d", client%256, (seq>>8)%256, seq%256)
	r.Service.ID = "web-" + r.Node
	r.Service.Service = "web"
	r.Service.Port = 8080
	b, _ := json.Marshal(r) // a struct of strings and an int always marshals
	return b
}

// send makes one request with body and fails unless the answer is 200
// with body true (KV put and catalog register both answer so).
func send(ctx context.Context, c *http.Client, method, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(io.LimitReader(resp.Body, 512))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, bytes.TrimSpace(got))
	}
	if string(bytes.TrimSpace(got)) != "true" {
		return fmt.Errorf("%w: %s %s answered %q, want true", errWrongAnswer, method, url, bytes.TrimSpace(got))
	}
	return nil
}

// kvEntry is the part of a /v1/kv/ answer a get checks.
type kvEntry struct {
	Key   string
	Value []byte
}

// checkGetJSON decodes a get's answer with encoding/json and checks that
// it holds one entry, key's, with a value of size bytes.
func checkGetJSON(key string, body []byte, size int) error {
	var got []kvEntry
	if err := json.Unmarshal(body, &got); err != nil {
		return fmt.Errorf("%w: GET %s: decode: %v", errWrongAnswer, key, err)
	}
	return checkEntries(key, got, size)
}

// checkGetAnswer checks a get's answer without a JSON decoder: a JSON
// array holding one "Key" field, key's, and one "Value" field whose
// base64 decodes (into scratch, returned for reuse) to size bytes.
func checkGetAnswer(scratch []byte, key string, body []byte, size int) ([]byte, error) {
	fail := func(why string) ([]byte, error) {
		return scratch, fmt.Errorf("%w: GET %s: %s in %.200q", errWrongAnswer, key, why, body)
	}
	b := bytes.TrimSpace(body)
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return fail("not a JSON array")
	}
	keyField, valueField := []byte(`"Key":`), []byte(`"Value":"`)
	if bytes.Count(b, keyField) != 1 || bytes.Count(b, valueField) != 1 {
		return fail("not exactly one Key and one Value")
	}
	k := b[bytes.Index(b, keyField)+len(keyField):]
	if !bytes.HasPrefix(k, []byte(`"`+key+`"`)) {
		return fail("another key")
	}
	v := b[bytes.Index(b, valueField)+len(valueField):]
	end := bytes.IndexByte(v, '"')
	if end < 0 {
		return fail("an unterminated Value")
	}
	scratch = slices.Grow(scratch[:0], base64.StdEncoding.DecodedLen(end))[:base64.StdEncoding.DecodedLen(end)]
	n, err := base64.StdEncoding.Decode(scratch, v[:end])
	if err != nil {
		return fail("a Value that is not base64")
	}
	if n != size {
		return fail(fmt.Sprintf("a value of %d bytes, want %d", n, size))
	}
	return scratch, nil
}

func checkEntries(key string, got []kvEntry, size int) error {
	switch {
	case len(got) != 1:
		return fmt.Errorf("%w: GET %s: %d entries, want 1", errWrongAnswer, key, len(got))
	case got[0].Key != key:
		return fmt.Errorf("%w: GET %s: entry for %q", errWrongAnswer, key, got[0].Key)
	case len(got[0].Value) != size:
		return fmt.Errorf("%w: GET %s: value of %d bytes, want %d", errWrongAnswer, key, len(got[0].Value), size)
	}
	return nil
}

// preload writes the n get keys with value on base from 16 writers, each
// on a connection of its own, and fails unless every put is acknowledged.
func preload(ctx context.Context, base string, n int, value []byte) error {
	const writers = 16
	cs := newConns(writers, base)
	defer cs.close()
	var next atomic.Int64
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && errs[w] == nil; i = int(next.Add(1) - 1) {
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				errs[w] = sendRaw(pctx, cs[w], http.MethodPut, "/v1/kv/"+getKey(i), value)
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// describe is the setup line of the workloads.
func describe(clients, valueSize, getKeys int) string {
	var parts []string
	for _, w := range selected {
		parts = append(parts, w.name+": "+w.what)
	}
	return fmt.Sprintf("workloads (%d closed-loop clients, one keep-alive HTTP/1.1 connection each, to the leader; %d-byte values; %d get keys preloaded before the gets): %s",
		clients, valueSize, getKeys, strings.Join(parts, "; "))
}
