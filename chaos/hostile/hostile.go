// Package hostile is the chaos harness's misbehaving client: beside the
// checked workloads, it abuses every node's limits for the whole
// campaign, and counts what it did and how the servers refused it.
//
// # What it does, against every node
//
//   - holds connections on the gRPC and the HTTP port up to the
//     server's per-client cap and, once it holds its share, opens more
//     until one is refused (the server closes it at accept);
//   - keeps HTTP connections open the slowloris way: a request header
//     sent one byte every few seconds, and idle connections that never
//     send a request;
//   - sends bodies the server must refuse: a /v1/txn over
//     --max-txn-request-bytes, malformed JSON, a value over
//     --max-value-bytes, a key that is not UTF-8, a txn with one
//     operation too many; over gRPC the same, and one transaction over
//     --max-request-bytes;
//   - floods watches: creates on one stream until the per-stream limit
//     refuses one, then more streams on the same connection until the
//     per-connection limit refuses one;
//   - with a token (a secure cluster): calls without any token, and reads
//     outside its token's rights. It never writes outside its own prefix,
//     and nothing it writes is valid, so nothing it does is applied.
//
// # What it owns
//
// Every connection and goroutine it starts; Run returns only when all of
// them are closed and ended.
//
// # Load
//
// Bounded by design: connections are topped up every HoldEvery, abuse
// requests go out one at a time per node on fixed tickers, and the watch
// flood is paced; the point is to abuse limits, not to load the machine.
package hostile

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/token"
)

// Limits are the server limits the client pushes against: what the
// campaign starts the servers with.
type Limits struct {
	GRPCConnsPerClient, HTTPConnsPerClient int // --max-{grpc,http}-connections-per-client
	WatchesPerStream, WatchesPerConn       int // --max-watches-per-{stream,connection}
	TxnRequestBytes                        int // --max-txn-request-bytes
	ValueBytes                             int // --max-value-bytes
	TxnOps                                 int // --max-txn-ops
	RequestBytes                           int // --max-request-bytes (gRPC)
}

// Target is one node: its gRPC and HTTP addresses (host:port).
type Target struct {
	Name               string
	GRPCAddr, HTTPAddr string
}

// Config configures the client.
type Config struct {
	Targets []Target
	// LocalIP is the source address every connection binds to (the
	// servers' per-client caps count by source address); "" lets the
	// kernel choose.
	LocalIP string
	// TLS is the client configuration with the client's certificate; nil
	// speaks plain text.
	TLS *tls.Config
	// Token is its ACL secret; "" on a cluster without ACLs (then the
	// no-token and forbidden probes are skipped).
	Token string
	// Prefix is the key prefix its token may write (its writes are all
	// invalid); Forbidden a key it may not read.
	Prefix, Forbidden string
	Limits            Limits
	// Reserve is how many connections per listener the holder leaves to
	// the other activities (default 3).
	Reserve int
	// HoldEvery is the holder's period (default 5s); AbuseEvery the HTTP
	// abuse period per node (default 600ms; gRPC's is twice that);
	// WatchEvery the watch flood's (default 10s); SlowEvery the slowloris
	// byte interval (default 3s).
	HoldEvery, AbuseEvery, WatchEvery, SlowEvery time.Duration
	Logger                                       *slog.Logger
}

// Client is one hostile client.
type Client struct {
	cfg   Config
	local *net.TCPAddr
	wg    sync.WaitGroup

	mu      sync.Mutex
	counts  map[string]map[string]int
	heldMax map[string]int
	life    map[string]time.Duration // longest life of a held connection the server closed, per kind

	// Built once, read-only.
	bigTxnJSON, tooManyOpsJSON, bigValue []byte
}

// New returns a client; Run starts it.
func New(cfg Config) *Client {
	if cfg.Reserve <= 0 {
		cfg.Reserve = 3
	}
	cfg.HoldEvery = or(cfg.HoldEvery, 5*time.Second)
	cfg.AbuseEvery = or(cfg.AbuseEvery, 600*time.Millisecond)
	cfg.WatchEvery = or(cfg.WatchEvery, 10*time.Second)
	cfg.SlowEvery = or(cfg.SlowEvery, 3*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Client{cfg: cfg, counts: map[string]map[string]int{}, heldMax: map[string]int{}, life: map[string]time.Duration{}}
	if cfg.LocalIP != "" {
		c.local = &net.TCPAddr{IP: net.ParseIP(cfg.LocalIP)}
	}
	l := cfg.Limits
	// A txn body just over its cap: one SET whose value fills it.
	pad := strings.Repeat("A", l.TxnRequestBytes+1024)
	c.bigTxnJSON = []byte(fmt.Sprintf(`[{"KV":{"Verb":"set","Key":%q,"Value":%q}}]`, cfg.Prefix+"big", pad))
	var ops []string
	for i := 0; i <= l.TxnOps; i++ {
		ops = append(ops, fmt.Sprintf(`{"KV":{"Verb":"get","Key":%q}}`, fmt.Sprintf("%sops/%d", cfg.Prefix, i)))
	}
	c.tooManyOpsJSON = []byte("[" + strings.Join(ops, ",") + "]")
	c.bigValue = bytes.Repeat([]byte("B"), l.ValueBytes+1)
	return c
}

func or(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Run abuses every target until ctx ends, then closes everything it
// opened and returns.
func (c *Client) Run(ctx context.Context) {
	for _, t := range c.cfg.Targets {
		c.spawn(func() { c.hold(ctx, t, "grpc") })
		c.spawn(func() { c.hold(ctx, t, "http") })
		c.spawn(func() { c.httpAbuse(ctx, t) })
		c.spawn(func() { c.grpcAbuse(ctx, t) })
	}
	<-ctx.Done()
	c.wg.Wait()
}

func (c *Client) spawn(f func()) {
	c.wg.Add(1)
	go func() { defer c.wg.Done(); f() }()
}

func (c *Client) count(activity, outcome string) {
	c.mu.Lock()
	m := c.counts[activity]
	if m == nil {
		m = map[string]int{}
		c.counts[activity] = m
	}
	m[outcome]++
	c.mu.Unlock()
}

// Summary is what the client did and how it was refused.
type Summary struct {
	// Counts maps an activity to its outcomes (an HTTP status, a gRPC
	// code, a connection's fate) and how often each happened.
	Counts map[string]map[string]int `json:"counts"`
	// HeldMax is the most connections the holder held at once on one
	// node, per listener; Cap the servers' per-client cap.
	HeldMax map[string]int `json:"held_max"`
	Cap     map[string]int `json:"cap"`
	// ClosedAfter is the longest a held connection of each kind lived
	// before the server closed it (idle and slowloris HTTP connections
	// must be closed by the header timeout).
	ClosedAfter map[string]string `json:"closed_after"`
	Source      string            `json:"source"`
}

// Summary returns the counts so far.
func (c *Client) Summary() Summary {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Summary{Counts: map[string]map[string]int{}, HeldMax: map[string]int{}, ClosedAfter: map[string]string{},
		Cap:    map[string]int{"grpc": c.cfg.Limits.GRPCConnsPerClient, "http": c.cfg.Limits.HTTPConnsPerClient},
		Source: c.cfg.LocalIP}
	for a, m := range c.counts {
		s.Counts[a] = map[string]int{}
		for o, n := range m {
			s.Counts[a][o] = n
		}
	}
	for k, v := range c.heldMax {
		s.HeldMax[k] = v
	}
	for k, v := range c.life {
		s.ClosedAfter[k] = v.Round(100 * time.Millisecond).String()
	}
	return s
}

// Lines is the summary as text, one activity a line.
func (s Summary) Lines() []string {
	var out []string
	out = append(out, fmt.Sprintf("from %s: connections held at most grpc %d, http %d per node (per-client cap %d, %d; the rest go to the other activities)",
		s.Source, s.HeldMax["grpc"], s.HeldMax["http"], s.Cap["grpc"], s.Cap["http"]))
	var kinds []string
	for k := range s.ClosedAfter {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	if len(kinds) > 0 {
		var parts []string
		for _, k := range kinds {
			parts = append(parts, k+" "+s.ClosedAfter[k])
		}
		out = append(out, "longest life of a held connection the server closed: "+strings.Join(parts, ", "))
	}
	var acts []string
	for a := range s.Counts {
		acts = append(acts, a)
	}
	sort.Strings(acts)
	for _, a := range acts {
		var outcomes []string
		for o := range s.Counts[a] {
			outcomes = append(outcomes, o)
		}
		sort.Strings(outcomes)
		var parts []string
		for _, o := range outcomes {
			parts = append(parts, fmt.Sprintf("%s×%d", o, s.Counts[a][o]))
		}
		out = append(out, fmt.Sprintf("%s: %s", a, strings.Join(parts, " ")))
	}
	return out
}

// Refused sums the outcomes that are refusals (a status of 4xx, a gRPC
// code other than OK, a connection refused at accept, a watch refused);
// total counts every attempt (not the slowloris bytes nor the closes of
// held connections, which are observations).
func (s Summary) Refused() (refused, total int) {
	for _, m := range s.Counts {
		for o, n := range m {
			if o == "byte sent" || o == "closed by the server" {
				continue
			}
			total += n
			if isRefusal(o) {
				refused += n
			}
		}
	}
	return refused, total
}

func isRefusal(o string) bool {
	return strings.HasPrefix(o, "4") || strings.HasPrefix(o, "refused") ||
		o == "InvalidArgument" || o == "PermissionDenied" || o == "ResourceExhausted"
}

// Head is the summary's first line.
func (s Summary) Head() string {
	r, t := s.Refused()
	return fmt.Sprintf("%d attempts, %d refused by a limit or ACL", t, r)
}

// dial opens a TCP connection from the client's source address.
func (c *Client) dial(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: c.local, Timeout: 2 * time.Second}
	return d.DialContext(ctx, "tcp", addr)
}

// classify names a connection-level error.
func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "node down"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		strings.Contains(err.Error(), "connection reset"), strings.Contains(err.Error(), "EOF"):
		return "refused at accept"
	}
	return "error"
}

// open makes one raw connection of kind ("grpc" or "http") to t: TCP, the
// TLS handshake with the client's certificate, and for gRPC the HTTP/2
// preface. A connection the server closes at accept fails here ("refused
// at accept").
func (c *Client) open(ctx context.Context, t Target, kind string) (net.Conn, string) {
	addr, proto := t.HTTPAddr, "http/1.1"
	if kind == "grpc" {
		addr, proto = t.GRPCAddr, "h2"
	}
	raw, err := c.dial(ctx, addr)
	if err != nil {
		return nil, classify(err)
	}
	conn := raw
	_ = raw.SetDeadline(time.Now().Add(2 * time.Second))
	if c.cfg.TLS != nil {
		cfg := c.cfg.TLS.Clone()
		cfg.NextProtos = []string{proto}
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, classify(err)
		}
		conn = tc
	}
	if kind == "grpc" {
		// The client preface and an empty SETTINGS frame; then nothing.
		if _, err := conn.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)); err != nil {
			conn.Close()
			return nil, classify(err)
		}
	}
	if c.cfg.TLS == nil {
		// In plain text a refused connection shows only when read: the
		// server closed it at once.
		_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		var b [1]byte
		if _, err := conn.Read(b[:]); err != nil && classify(err) != "timeout" {
			conn.Close()
			return nil, classify(err)
		}
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, "accepted"
}

// heldConn is one connection the holder keeps.
type heldConn struct {
	conn   net.Conn
	kind   string // "grpc", "http-idle" or "http-slowloris"
	opened time.Time
	done   chan struct{} // closed when the server closed it (or we did)
}

// hold keeps connections of kind open on t: up to the per-client cap
// less Reserve, topped up every HoldEvery; then it opens more until the
// server refuses one, and closes those extra ones at once.
func (c *Client) hold(ctx context.Context, t Target, kind string) {
	limit := c.cfg.Limits.GRPCConnsPerClient
	if kind == "http" {
		limit = c.cfg.Limits.HTTPConnsPerClient
	}
	if limit <= 0 {
		return
	}
	want := max(limit-c.cfg.Reserve, 1)
	var held []*heldConn
	var readers sync.WaitGroup
	defer func() {
		for _, h := range held {
			h.conn.Close()
		}
		readers.Wait()
	}()
	tick := time.NewTicker(c.cfg.HoldEvery)
	defer tick.Stop()
	for n := 0; ; n++ {
		live := held[:0]
		for _, h := range held {
			select {
			case <-h.done:
				h.conn.Close()
			default:
				live = append(live, h)
			}
		}
		clear(held[len(live):])
		held = live
		for len(held) < want && ctx.Err() == nil {
			conn, outcome := c.open(ctx, t, kind)
			if conn == nil && ctx.Err() != nil {
				break
			}
			c.count(kind+" hold", outcome)
			if conn == nil {
				break
			}
			h := &heldConn{conn: conn, kind: kind, opened: time.Now(), done: make(chan struct{})}
			if kind == "http" {
				h.kind = "http-idle"
				if len(held)%2 == 1 {
					h.kind = "http-slowloris"
				}
			}
			held = append(held, h)
			readers.Add(1)
			go func() { defer readers.Done(); c.keep(ctx, h) }()
		}
		c.mu.Lock()
		c.heldMax[kind] = max(c.heldMax[kind], len(held))
		c.mu.Unlock()
		if len(held) >= want && ctx.Err() == nil {
			// Past the share: the server must refuse once the cap is
			// reached (the other activities hold the rest).
			var extra []net.Conn
			for i := 0; i < c.cfg.Reserve+2; i++ {
				conn, outcome := c.open(ctx, t, kind)
				if conn == nil && ctx.Err() != nil {
					break
				}
				if conn == nil {
					if outcome == "refused at accept" {
						outcome = fmt.Sprintf("refused at accept (cap %d)", limit)
					}
					c.count(kind+" over the cap", outcome)
					break
				}
				c.count(kind+" over the cap", "accepted (a slot was free)")
				extra = append(extra, conn)
			}
			for _, e := range extra {
				e.Close()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// keep reads a held connection until it closes and records who closed it
// and after how long; a slowloris connection also sends a request header
// one byte every SlowEvery.
func (c *Client) keep(ctx context.Context, h *heldConn) {
	var writer sync.WaitGroup
	if h.kind == "http-slowloris" {
		writer.Add(1)
		go func() {
			defer writer.Done()
			hdr := "GET /v1/kv/" + c.cfg.Prefix + "slow HTTP/1.1\r\nHost: lodestone\r\nX-Slow: "
			if _, err := io.WriteString(h.conn, hdr); err != nil {
				return
			}
			t := time.NewTicker(c.cfg.SlowEvery)
			defer t.Stop()
			for {
				select {
				case <-h.done:
					return
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if _, err := h.conn.Write([]byte("a")); err != nil {
					return
				}
				c.count("http slowloris", "byte sent")
			}
		}()
	}
	_, _ = io.Copy(io.Discard, h.conn)
	life := time.Since(h.opened)
	close(h.done)
	writer.Wait()
	if ctx.Err() != nil {
		return // we closed it
	}
	c.count(h.kind+" held", "closed by the server")
	c.mu.Lock()
	c.life[h.kind] = max(c.life[h.kind], life)
	c.mu.Unlock()
}

// httpAbuse sends one bad request to t every AbuseEvery, in turn.
func (c *Client) httpAbuse(ctx context.Context, t Target) {
	scheme := "http"
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, addr string) (net.Conn, error) { return c.dial(ctx, addr) },
		MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1, IdleConnTimeout: 5 * time.Second,
	}
	if c.cfg.TLS != nil {
		scheme, tr.TLSClientConfig = "https", c.cfg.TLS.Clone()
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	base := scheme + "://" + t.HTTPAddr
	type abuse struct {
		name   string
		method string
		path   string
		body   []byte
		token  bool
	}
	p := c.cfg.Prefix
	list := []abuse{
		{"txn over max-txn-request-bytes", http.MethodPut, "/v1/txn", c.bigTxnJSON, true},
		{"txn malformed JSON", http.MethodPut, "/v1/txn", []byte(`[{"KV": {"Verb": "set", "Key": "` + p + `x", "Value": `), true},
		{"txn over max-txn-ops", http.MethodPut, "/v1/txn", c.tooManyOpsJSON, true},
		{"kv put invalid UTF-8 key", http.MethodPut, "/v1/kv/" + p + "%FF%FEbad", []byte("x"), true},
		{"kv put over max-value-bytes", http.MethodPut, "/v1/kv/" + p + "big", c.bigValue, true},
		{"kv put NUL in key", http.MethodPut, "/v1/kv/" + p + "nul%00key", []byte("x"), true},
	}
	if c.cfg.Token != "" {
		list = append(list,
			abuse{"kv get without a token", http.MethodGet, "/v1/kv/" + p + "x", nil, false},
			abuse{"kv get outside its rights", http.MethodGet, "/v1/kv/" + c.cfg.Forbidden, nil, true})
	}
	tick := time.NewTicker(c.cfg.AbuseEvery)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		a := list[i%len(list)]
		var body io.Reader
		if a.body != nil {
			body = bytes.NewReader(a.body)
		}
		req, err := http.NewRequestWithContext(ctx, a.method, base+a.path, body)
		if err != nil {
			c.count("http "+a.name, "error")
			continue
		}
		if a.token {
			req.Header.Set(token.Header, c.cfg.Token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				c.count("http "+a.name, classify(err))
			}
			continue
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		c.count("http "+a.name, fmt.Sprint(resp.StatusCode))
	}
}

// grpcAbuse sends one bad request to t every 2×AbuseEvery, in turn, and
// runs the watch flood on the same connection.
func (c *Client) grpcAbuse(ctx context.Context, t Target) {
	creds := insecure.NewCredentials()
	if c.cfg.TLS != nil {
		creds = credentials.NewTLS(c.cfg.TLS.Clone())
	}
	conn, err := grpc.NewClient(t.GRPCAddr, grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(c.dial),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		c.count("grpc dial", "error")
		return
	}
	defer conn.Close()
	var auth []grpc.CallOption
	if c.cfg.Token != "" {
		auth = []grpc.CallOption{grpc.PerRPCCredentials(token.PerRPC(c.cfg.Token))}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() { defer wg.Done(); c.watchFlood(ctx, conn, auth) }()

	l, p := c.cfg.Limits, c.cfg.Prefix
	kv := lodestonepb.NewKVClient(conn)
	var tooMany []*lodestonepb.TxnOp
	for i := 0; i <= l.TxnOps; i++ {
		tooMany = append(tooMany, &lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_GET, Key: []byte(fmt.Sprintf("%sops/%d", p, i))})
	}
	// Over the gRPC message cap in ops that are each within the value
	// cap and few enough for the op cap.
	var huge []*lodestonepb.TxnOp
	for i := 0; i*l.ValueBytes <= l.RequestBytes; i++ {
		huge = append(huge, &lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: []byte(fmt.Sprintf("%shuge/%d", p, i)), Value: c.bigValue[:l.ValueBytes]})
	}
	type abuse struct {
		name string
		call func(context.Context) error
	}
	list := []abuse{
		{"txn over max-txn-ops", func(ctx context.Context) error {
			_, err := kv.Txn(ctx, &lodestonepb.TxnRequest{Ops: tooMany}, auth...)
			return err
		}},
		{"txn over max-value-bytes", func(ctx context.Context) error {
			_, err := kv.Txn(ctx, &lodestonepb.TxnRequest{Ops: []*lodestonepb.TxnOp{{Verb: lodestonepb.TxnOp_SET, Key: []byte(p + "big"), Value: c.bigValue}}}, auth...)
			return err
		}},
		{"put invalid UTF-8 key", func(ctx context.Context) error {
			_, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte(p + "\xff\xfebad"), Value: []byte("x")}, auth...)
			return err
		}},
		{"txn over max-request-bytes", func(ctx context.Context) error {
			_, err := kv.Txn(ctx, &lodestonepb.TxnRequest{Ops: huge}, auth...)
			return err
		}},
	}
	if c.cfg.Token != "" {
		list = append(list,
			abuse{"get without a token", func(ctx context.Context) error {
				_, err := kv.Get(ctx, &lodestonepb.GetRequest{Key: []byte(p + "x")})
				return err
			}},
			abuse{"get outside its rights", func(ctx context.Context) error {
				_, err := kv.Get(ctx, &lodestonepb.GetRequest{Key: []byte(c.cfg.Forbidden)}, auth...)
				return err
			}})
	}
	tick := time.NewTicker(2 * c.cfg.AbuseEvery)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		a := list[i%len(list)]
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := a.call(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		c.count("grpc "+a.name, status.Code(err).String())
	}
}

// watchFlood, every WatchEvery: on one connection, streams of watch
// creates (paced) until the per-stream limit refuses one, then the next
// stream, until the per-connection limit refuses one; it holds them a
// moment and ends them.
func (c *Client) watchFlood(ctx context.Context, conn *grpc.ClientConn, auth []grpc.CallOption) {
	l := c.cfg.Limits
	if l.WatchesPerStream <= 0 || l.WatchesPerConn <= 0 {
		return
	}
	wc := lodestonepb.NewWatchClient(conn)
	tick := time.NewTicker(c.cfg.WatchEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c.floodOnce(ctx, wc, auth)
	}
}

func (c *Client) floodOnce(ctx context.Context, wc lodestonepb.WatchClient, auth []grpc.CallOption) {
	l := c.cfg.Limits
	fctx, cancel := context.WithTimeout(ctx, c.cfg.WatchEvery*8/10)
	defer cancel()
	pace := time.NewTicker(2 * time.Millisecond)
	defer pace.Stop()
	for s := 0; s < l.WatchesPerConn/l.WatchesPerStream+2; s++ {
		st, err := wc.Watch(fctx, auth...)
		if err != nil {
			c.count("grpc watch stream", status.Code(err).String())
			return
		}
		c.count("grpc watch stream", "opened")
		for id := int64(1); id <= int64(l.WatchesPerStream)+1; id++ {
			select {
			case <-fctx.Done():
				return
			case <-pace.C:
			}
			err := st.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: &lodestonepb.WatchCreate{
				WatchId: id, Key: []byte(c.cfg.Prefix + "flood/"), Prefix: true}}})
			var resp *lodestonepb.WatchResponse
			for err == nil && (resp == nil || resp.WatchId != id || (!resp.Created && !resp.Canceled)) {
				resp, err = st.Recv()
			}
			if err != nil {
				if fctx.Err() == nil {
					c.count("grpc watch create", status.Code(err).String())
				}
				return
			}
			switch {
			case resp.Created:
				c.count("grpc watch create", "created")
			case strings.Contains(resp.CancelReason, "max-watches-per-stream"):
				c.count("grpc watch create", "refused (max-watches-per-stream)")
			case strings.Contains(resp.CancelReason, "max-watches-per-connection"):
				c.count("grpc watch create", "refused (max-watches-per-connection)")
				<-fctx.Done() // hold them until the cycle ends
				return
			default:
				reason := resp.CancelReason
				if len(reason) > 60 {
					reason = reason[:60] + "..."
				}
				c.count("grpc watch create", "canceled: "+reason)
			}
			if resp.Canceled {
				break
			}
		}
	}
	<-fctx.Done()
}
