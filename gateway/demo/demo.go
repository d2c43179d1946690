// Package demo is the small service `lodestone dev` puts behind its
// gateway, so a newcomer sees routing, balancing and failure handling
// work on the first command.
//
// Run starts a few instances of the demo service on loopback ports,
// registers them in the catalog (node Node, service Service, one passing
// check each) and a route "demo" for "/" under the gateway's KV prefix
// (unless a route of that name exists), runs a gateway fed by the catalog
// in front of them, and deregisters them when its ctx ends.
//
// The demo service answers:
//
//	GET /              JSON: which instance answered, the path, the headers the gateway added
//	GET /slow?ms=N     the same after N milliseconds (try the gateway's timeouts)
//	GET /status/N      status N (try retries and outlier ejection with 503)
//	GET /stream?n=N    N lines one every 100ms, streamed (the gateway never buffers them)
//	GET /healthz       ok (also /health, the path agents' checks use)
//
// `lodestone demo` serves one instance of it on its own, for containers.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/gateway"
)

// Service is the demo's service name in the catalog.
const Service = "demo"

// Node is the catalog node the demo instances are registered on. Run
// deregisters it (with everything on it) when it starts and when it stops.
const Node = "dev-demo"

// Handler returns the demo service's handler for the instance named id.
func Handler(id string) http.Handler {
	var served atomic.Int64
	mux := http.NewServeMux()
	hello := func(w http.ResponseWriter, r *http.Request) {
		n := served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"instance":          id,
			"served":            n,
			"path":              r.URL.Path,
			"host":              r.Host,
			"proto":             r.Proto,
			"x_forwarded_for":   r.Header.Get("X-Forwarded-For"),
			"x_forwarded_host":  r.Header.Get("X-Forwarded-Host"),
			"x_forwarded_proto": r.Header.Get("X-Forwarded-Proto"),
		})
	}
	mux.HandleFunc("GET /", hello)
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		select {
		case <-time.After(time.Duration(min(max(ms, 0), 600_000)) * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		hello(w, r)
	})
	mux.HandleFunc("GET /status/{code}", func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.PathValue("code"))
		if err != nil || code < 200 || code > 599 {
			http.Error(w, "want /status/200..599", http.StatusBadRequest)
			return
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "%s answered %d\n", id, code)
	})
	mux.HandleFunc("GET /stream", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		n = min(max(n, 1), 1000)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for i := range n {
			fmt.Fprintf(w, "%s line %d\n", id, i+1)
			w.(http.Flusher).Flush()
			if i < n-1 {
				select {
				case <-time.After(100 * time.Millisecond):
				case <-r.Context().Done():
					return
				}
			}
		}
	})
	ok := func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }
	mux.HandleFunc("GET /healthz", ok)
	mux.HandleFunc("GET /health", ok)
	return mux
}

// Config configures Run.
type Config struct {
	// Client reaches the registry; required. The caller owns it.
	Client *client.Client
	// Gateway configures the gateway. Listen and AdminListen default as
	// in gateway.DevConfig (127.0.0.1:8080 and :8081); Source is set by
	// Run (a CatalogSource over Client, routes under Gateway.KVPrefix).
	Gateway gateway.Config
	// Instances is how many demo instances to start. Default 2.
	Instances int
	// Ready, if set, is called once the gateway serves, with its address,
	// its admin address and the demo instances' addresses.
	Ready func(proxy, admin string, instances []string)
	// Logger receives the gateway's logs; nil discards.
	Logger *slog.Logger
}

// Run serves the demo behind a gateway until ctx ends (then returns nil),
// or returns the error that stopped it.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Client == nil {
		return errors.New("demo: Config.Client is required")
	}
	if cfg.Instances <= 0 {
		cfg.Instances = 2
	}
	gcfg := cfg.Gateway
	if gcfg.Listen == "" && gcfg.AdminListen == "" && gcfg.Shards == 0 {
		gcfg = gateway.DevConfig()
	}
	gcfg.Logger = cfg.Logger
	scfg := gateway.DefaultCatalogSourceConfig()
	if gcfg.KVPrefix != "" {
		scfg.Prefix = gcfg.KVPrefix
	}
	scfg.Logger = cfg.Logger
	src, err := gateway.NewCatalogSource(cfg.Client, scfg)
	if err != nil {
		return err
	}
	gcfg.Source = src
	// Instances a crashed earlier run left behind point at dead ports.
	if _, err := cfg.Client.Deregister(ctx, Node, "", ""); err != nil {
		return fmt.Errorf("deregister the demo node %q left by an earlier run: %w", Node, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		cfg.Client.Deregister(dctx, Node, "", "")
	}()

	// The instances.
	var (
		wg    sync.WaitGroup
		srvs  []*http.Server
		addrs []string
	)
	defer func() {
		for _, s := range srvs {
			s.Close()
		}
		wg.Wait()
	}()
	var last uint64
	for i := 1; i <= cfg.Instances; i++ {
		id := fmt.Sprintf("demo-%d", i)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("demo instance %s: %w", id, err)
		}
		s := &http.Server{Handler: Handler(id), ReadHeaderTimeout: 10 * time.Second}
		srvs = append(srvs, s)
		wg.Go(func() { s.Serve(ln) })
		host, port, _ := net.SplitHostPort(ln.Addr().String())
		p, _ := strconv.Atoi(port)
		addrs = append(addrs, ln.Addr().String())
		if last, err = register(ctx, cfg.Client, id, host, p); err != nil {
			return fmt.Errorf("register demo instance %s: %w", id, err)
		}
	}
	route, err := json.Marshal(gateway.Route{Name: Service, PathPrefix: "/", Service: Service})
	if err != nil {
		return err
	}
	// Only if absent: a route the user edited stays as they left it.
	if _, err := cfg.Client.Put(ctx, src.RouteKey(Service), route, client.WithCAS(0)); err != nil && !errors.Is(err, client.ErrCASFailed) {
		return fmt.Errorf("register the demo route: %w", err)
	}

	g, err := gateway.New(gcfg)
	if err != nil {
		return err
	}
	g.Start()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	g.WaitIndex(wctx, last)
	cancel()
	if cfg.Ready != nil {
		cfg.Ready(g.Addr(), g.AdminAddr(), addrs)
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-g.Done():
	}
	if err := g.Close(); err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}

// register registers demo instance id at host:port on Node with a passing
// check (no agent runs checks in `lodestone dev`; set its status with
// `lodestone catalog register` to see the gateway drain the instance) and
// returns the write's index.
func register(ctx context.Context, c *client.Client, id, host string, port int) (uint64, error) {
	resp, err := c.Register(ctx, &lodestonepb.CatalogRegisterRequest{
		Node:    &lodestonepb.Node{Name: Node, Address: host},
		Service: &lodestonepb.Service{Id: id, Name: Service, Address: host, Port: uint32(port)},
		Checks: []*lodestonepb.Check{{CheckId: id, Name: id + " alive", ServiceId: id,
			Status: lodestonepb.HealthStatus_HEALTH_PASSING, Notes: "registered passing by lodestone dev"}},
	})
	if err != nil {
		return 0, err
	}
	return resp.GetHeader().GetIndex(), nil
}
