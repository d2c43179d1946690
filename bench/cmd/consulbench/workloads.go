package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

// workload is one kind of request, driven the same way at both systems.
type workload struct {
	name string // run lines and samples: "kv-put", "kv-get", "catalog-register"
	what string // the setup line's description
}

var (
	putWorkload      = workload{"kv-put", "PUT /v1/kv/consulbench/put/<client>/<seq> of a random value, each client its own keys"}
	getWorkload      = workload{"kv-get", "GET /v1/kv/consulbench/get/<n> in the default consistency mode (no ?stale, no ?consistent), n drawn per op from the preloaded keys, the JSON answer decoded and the value's size checked"}
	registerWorkload = workload{"catalog-register", "PUT /v1/catalog/register of a new node (cb-<client>-<seq>, its own address) with one service instance (web, port 8080)"}
	workloads        = []workload{putWorkload, getWorkload, registerWorkload}
)

// errWrongAnswer marks an op the server answered, but wrongly: it counts
// as failed, never as fast.
var errWrongAnswer = errors.New("wrong answer")

// conns is one keep-alive HTTP/1.1 connection per client: a transport of
// its own each, so n clients hold exactly n connections to the leader.
type conns []*http.Client

func newConns(n int) conns {
	cs := make(conns, n)
	for i := range cs {
		cs[i] = &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 1,
			MaxConnsPerHost:     1,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		}}
	}
	return cs
}

func (cs conns) close() {
	for _, c := range cs {
		c.CloseIdleConnections()
	}
}

// op is w's operation against base for harness.Drive: client c sends on
// cs[c]; values[c] is the value it puts; a get must find a value of
// valueSize bytes among getKeys preloaded keys.
func (w workload) op(base string, cs conns, values [][]byte, valueSize, getKeys int) harness.Op {
	switch w.name {
	case getWorkload.name:
		return func(ctx context.Context, client, seq int) error {
			return getValue(ctx, cs[client], base, getKey(int(draw(client, seq)%uint64(getKeys))), valueSize)
		}
	case registerWorkload.name:
		return func(ctx context.Context, client, seq int) error {
			return send(ctx, cs[client], http.MethodPut, base+"/v1/catalog/register", registerBody(client, seq))
		}
	default:
		return func(ctx context.Context, client, seq int) error {
			return send(ctx, cs[client], http.MethodPut, base+"/v1/kv/"+putKey(client, seq), values[client])
		}
	}
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

// getValue reads key in the default consistency mode and checks that the
// one entry it gets is key's, with a value of size bytes.
func getValue(ctx context.Context, c *http.Client, base, key string, size int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/kv/"+key, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %s: %s", key, resp.Status, bytes.TrimSpace(b))
	}
	var got []kvEntry
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		return fmt.Errorf("GET %s: decode: %w", key, err)
	}
	return checkEntries(key, got, size)
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
	cs := newConns(writers)
	defer cs.close()
	var next atomic.Int64
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && errs[w] == nil; i = int(next.Add(1) - 1) {
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				errs[w] = send(pctx, cs[w], http.MethodPut, base+"/v1/kv/"+getKey(i), value)
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
