package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// loadSpec is what a cluster is loaded with: n keys of size bytes, or
// (nodes > 0) a catalog of nodes with instances service instances spread
// evenly over them.
type loadSpec struct {
	keys, size, batch, writers int
	nodes, instances           int
}

func (s loadSpec) String() string {
	if s.nodes > 0 {
		return fmt.Sprintf("%d nodes with %d service instances through the Consul HTTP API (%d clients)", s.nodes, s.instances, s.writers)
	}
	return fmt.Sprintf("%d keys of %d bytes (transactions of %d puts, %d clients)", s.keys, s.size, s.batch, s.writers)
}

// label names the load in BENCH lines: 1m, 50k, catalog-10k-nodes-100k-instances.
func (s loadSpec) label() string {
	if s.nodes > 0 {
		return fmt.Sprintf("catalog-%s-nodes-%s-instances", count(s.nodes), count(s.instances))
	}
	return count(s.keys)
}

// count prints n for a name: 1000000 → 1m, 50000 → 50k, 1234 → 1234.
func count(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dm", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// checkKey is written after a catalog load and read after each restart.
const checkKey = "scalebench/loaded"

// check is the key a restarted member must serve, with its value: the
// last key loaded, or the catalog's check key.
func (s loadSpec) check() ([]byte, []byte) {
	if s.nodes > 0 {
		return []byte(checkKey), []byte("catalog")
	}
	return keyOf(s.keys - 1), valueOf(s.keys-1, s.size)
}

func (s loadSpec) run(ctx context.Context, c *cluster) (time.Duration, error) {
	if s.nodes == 0 {
		return c.load(ctx, s.keys, s.size, s.batch, s.writers)
	}
	start := time.Now()
	if err := c.loadCatalog(ctx, s.nodes, s.instances, s.writers); err != nil {
		return 0, err
	}
	conn, err := dial(c.clients[c.leader])
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	key, value := s.check()
	if err := c.sys.ops(conn).putBatch(ctx, [][]byte{key}, [][]byte{value}); err != nil {
		return 0, fmt.Errorf("write %s: %w", key, err)
	}
	return time.Since(start), nil
}

// registration is the body of PUT /v1/catalog/register for instance i of
// a catalog of nodes nodes: instance i runs on node i mod nodes, as
// service svc-(i/nodes mod 100), with the node's address and two tags.
type registration struct {
	Node    string
	Address string
	Service registeredService
}

type registeredService struct {
	ID      string
	Service string
	Tags    []string
	Port    int
}

func registrationOf(i, nodes int) registration {
	n := i % nodes
	round := i / nodes
	return registration{
		Node:    fmt.Sprintf("node-%05d", n),
		Address: fmt.Sprintf("10.%d.%d.%d", n>>16&0xff, n>>8&0xff, n&0xff),
		Service: registeredService{
			ID:      fmt.Sprintf("svc-%02d-%05d", round%100, n),
			Service: fmt.Sprintf("svc-%02d", round%100),
			Tags:    []string{"scalebench", fmt.Sprintf("round-%d", round)},
			Port:    20000 + round,
		},
	}
}

// loadCatalog registers instances service instances on nodes nodes
// (instances >= nodes, so every node gets one) through the Consul HTTP
// API on the leader, one PUT /v1/catalog/register each from writers
// clients on keep-alive connections.
func (c *cluster) loadCatalog(ctx context.Context, nodes, instances, writers int) error {
	url := "http://" + c.http[c.leader] + "/v1/catalog/register"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: writers}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var next atomic.Int64
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < instances && errs[w] == nil && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				errs[w] = register(ctx, client, url, registrationOf(i, nodes))
			}
		})
	}
	wg.Wait()
	return errors.Join(append(errs, ctx.Err())...)
}

func register(ctx context.Context, client *http.Client, url string, r registration) error {
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("register %s on %s: %w", r.Service.ID, r.Node, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK || string(bytes.TrimSpace(answer)) != "true" {
		return fmt.Errorf("register %s on %s: %s %q", r.Service.ID, r.Node, resp.Status, answer)
	}
	return nil
}
