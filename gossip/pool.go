package gossip

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// Pool is this process's membership in the gossip pool: a memberlist
// instance feeding a Roster.
type Pool struct {
	cfg    Config
	logger *slog.Logger
	now    func() time.Time
	ml     *memberlist.Memberlist
	meta   *atomic.Pointer[[]byte]

	mu     sync.Mutex
	roster *Roster
	joined bool

	changed chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error

	events      *prometheus.CounterVec
	joinAttempt *prometheus.CounterVec
	membersDesc *prometheus.Desc
}

// New validates cfg, binds the gossip sockets and starts memberlist with
// this member alone in its pool. Start joins others.
func New(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	p := &Pool{
		cfg: cfg, logger: logger, now: now,
		meta:    new(atomic.Pointer[[]byte]),
		roster:  NewRoster(cfg.ForgetAfter),
		changed: make(chan struct{}, 1),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Subsystem: "gossip", Name: "events_total",
			Help: "Pool membership events seen by this member: join, update, failed, left.",
		}, []string{"event"}),
		joinAttempt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Subsystem: "gossip", Name: "join_attempts_total",
			Help: "Attempts to join the pool by outcome (ok, error).",
		}, []string{"result"}),
		membersDesc: prometheus.NewDesc("lodestone_gossip_members", "Pool members by state as this member sees them.", []string{"state"}, nil),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.setMeta(Meta{Role: cfg.Role, Name: cfg.Name})

	mc, err := p.memberlistConfig()
	if err != nil {
		return nil, err
	}
	p.ml, err = memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("start gossip on %s: %w", cfg.BindAddr, err)
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(p); err != nil {
			p.ml.Shutdown()
			return nil, fmt.Errorf("register gossip metrics: %w", err)
		}
	}
	logger.Info("gossip started", "addr", p.Addr(), "role", string(cfg.Role), "encrypted", cfg.EncryptKey != "")
	return p, nil
}

func (p *Pool) memberlistConfig() (*memberlist.Config, error) {
	cfg := p.cfg
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Name
	host, port, err := splitHostPort(cfg.BindAddr)
	if err != nil {
		return nil, &ConfigError{Field: "bind", Err: err}
	}
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertiseAddr, mc.AdvertisePort = "", port
	if cfg.AdvertiseAddr != "" {
		host, port, err := splitHostPort(cfg.AdvertiseAddr)
		if err != nil {
			return nil, &ConfigError{Field: "advertise", Err: err}
		}
		mc.AdvertiseAddr, mc.AdvertisePort = host, port
	}
	key, err := cfg.key()
	if err != nil {
		return nil, &ConfigError{Field: "encrypt", Err: err}
	}
	mc.SecretKey = key
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeTimeout
	mc.SuspicionMult = cfg.SuspicionMult
	mc.SuspicionMaxTimeoutMult = cfg.SuspicionMaxTimeoutMult
	mc.GossipInterval = cfg.GossipInterval
	mc.PushPullInterval = cfg.PushPullInterval
	// NB: a member restarted after a crash may come back on another port
	// (or address); without a reclaim time memberlist refuses its alive
	// message for as long as it remembers the dead one.
	mc.DeadNodeReclaimTime = cfg.ProbeInterval
	mc.Delegate = metaDelegate{p.meta}
	mc.Events = poolEvents{p}
	mc.Logger = log.New(&slogWriter{logger: p.logger}, "", 0)
	return mc, nil
}

func (p *Pool) setMeta(m Meta) {
	b := EncodeMeta(m)
	p.meta.Store(&b)
}

// Start begins the background work: join retries until one member in
// cfg.Join answers, and forgetting long-gone members.
func (p *Pool) Start() {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.run()
	}()
}

func (p *Pool) run() {
	join := len(p.cfg.Join) > 0
	forget := time.NewTicker(max(time.Minute, p.cfg.ForgetAfter/100))
	defer forget.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	if !join {
		retry.Stop()
	}
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-retry.C:
			if _, err := p.Join(p.cfg.Join); err != nil {
				p.logger.Warn("gossip join failed; retrying", "join", p.cfg.Join, "retry_in", p.cfg.RetryJoinInterval, "err", err)
				retry.Reset(p.cfg.RetryJoinInterval)
			}
		case <-forget.C:
			p.mu.Lock()
			gone := p.roster.Forget(p.now())
			p.mu.Unlock()
			if len(gone) > 0 {
				p.logger.Info("gossip forgot members", "members", gone)
				p.notify()
			}
		}
	}
}

// Join contacts addrs (host:port) and merges their view of the pool. It
// returns how many answered; an error means none did.
func (p *Pool) Join(addrs []string) (int, error) {
	n, err := p.ml.Join(addrs)
	if err != nil {
		p.joinAttempt.WithLabelValues("error").Inc()
		return n, fmt.Errorf("join gossip pool via %v: %w", addrs, err)
	}
	p.joinAttempt.WithLabelValues("ok").Inc()
	p.mu.Lock()
	first := !p.joined
	p.joined = true
	p.mu.Unlock()
	if first {
		p.logger.Info("joined gossip pool", "via", addrs, "answered", n)
	}
	return n, nil
}

// Addr is the host:port other members reach this one at.
func (p *Pool) Addr() string {
	n := p.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Name is this member's name.
func (p *Pool) Name() string { return p.cfg.Name }

// Config is the configuration the pool runs with.
func (p *Pool) Config() Config { return p.cfg }

// Members returns every member this one knows of, sorted by name.
func (p *Pool) Members() []Member {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.roster.Members()
}

// Changed is signalled (coalesced, capacity one) whenever the Roster
// changes. One reader only.
func (p *Pool) Changed() <-chan struct{} { return p.changed }

func (p *Pool) notify() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// Leave announces this member's departure and waits up to timeout for the
// announcement to go out. Close afterwards.
//
// NB: memberlist's leave callback does not tell a departure from a
// failure, so Leave first gossips metadata with Leaving set (the others
// record it), then leaves. A member that hears the leave before the update
// (possible in large pools) records a failure instead.
func (p *Pool) Leave(timeout time.Duration) error {
	p.setMeta(Meta{Role: p.cfg.Role, Name: p.cfg.Name, Leaving: true})
	if err := p.ml.UpdateNode(timeout); err != nil {
		p.logger.Warn("announce leaving", "err", err)
	}
	if err := p.ml.Leave(timeout); err != nil {
		return fmt.Errorf("leave gossip pool: %w", err)
	}
	p.logger.Info("left gossip pool")
	return nil
}

// Close stops the background work and memberlist, closing its sockets.
// Without Leave first, the others declare this member failed.
func (p *Pool) Close() error {
	p.closeOnce.Do(func() {
		p.cancel()
		p.wg.Wait()
		if err := p.ml.Shutdown(); err != nil {
			p.closeErr = fmt.Errorf("stop gossip: %w", err)
		}
		if p.cfg.Registerer != nil {
			p.cfg.Registerer.Unregister(p)
		}
	})
	return p.closeErr
}

// Describe and Collect export the pool's metrics.
func (p *Pool) Describe(ch chan<- *prometheus.Desc) {
	ch <- p.membersDesc
	p.events.Describe(ch)
	p.joinAttempt.Describe(ch)
}

func (p *Pool) Collect(ch chan<- prometheus.Metric) {
	counts := map[State]int{}
	for _, m := range p.Members() {
		counts[m.State]++
	}
	for _, st := range States {
		ch <- prometheus.MustNewConstMetric(p.membersDesc, prometheus.GaugeValue, float64(counts[st]), st.String())
	}
	p.events.Collect(ch)
	p.joinAttempt.Collect(ch)
}

type metaDelegate struct{ meta *atomic.Pointer[[]byte] }

func (d metaDelegate) NodeMeta(limit int) []byte {
	m := *d.meta.Load()
	if len(m) > limit {
		return nil // two short strings; never happens with sane names
	}
	return m
}
func (metaDelegate) NotifyMsg([]byte)                           {}
func (metaDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (metaDelegate) LocalState(join bool) []byte                { return nil }
func (metaDelegate) MergeRemoteState(buf []byte, join bool)     {}

// poolEvents feeds memberlist's callbacks into the Roster. Memberlist calls
// them from its own goroutines, never concurrently with each other for one
// node; they must not block.
type poolEvents struct{ p *Pool }

func (e poolEvents) NotifyJoin(n *memberlist.Node)   { e.alive(n, "join") }
func (e poolEvents) NotifyUpdate(n *memberlist.Node) { e.alive(n, "update") }

func (e poolEvents) alive(n *memberlist.Node, event string) {
	p := e.p
	p.mu.Lock()
	changed := p.roster.Alive(n.Name, n.Address(), DecodeMeta(n.Meta), p.now())
	p.mu.Unlock()
	p.events.WithLabelValues(event).Inc()
	if changed {
		p.logger.Info("gossip member alive", "member", n.Name, "addr", n.Address(), "event", event)
		p.notify()
	}
}

func (e poolEvents) NotifyLeave(n *memberlist.Node) {
	p := e.p
	p.mu.Lock()
	changed := p.roster.Gone(n.Name, n.Address(), DecodeMeta(n.Meta), p.now())
	m, _ := p.roster.Get(n.Name)
	p.mu.Unlock()
	event := m.State.String()
	p.events.WithLabelValues(event).Inc()
	if changed {
		p.logger.Info("gossip member "+event, "member", n.Name, "addr", n.Address())
		p.notify()
	}
}

// slogWriter turns memberlist's "[LEVEL] memberlist: msg" lines into slog
// records.
type slogWriter struct{ logger *slog.Logger }

func (w *slogWriter) Write(b []byte) (int, error) {
	line := bytes.TrimSpace(b)
	level := slog.LevelInfo
	for prefix, lv := range map[string]slog.Level{"[DEBUG]": slog.LevelDebug, "[INFO]": slog.LevelInfo, "[WARN]": slog.LevelWarn, "[ERR]": slog.LevelError} {
		if rest, ok := bytes.CutPrefix(line, []byte(prefix)); ok {
			level, line = lv, bytes.TrimSpace(rest)
			break
		}
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	w.logger.Log(context.Background(), level, string(line), "component", "memberlist")
	return len(b), nil
}

var _ memberlist.Delegate = metaDelegate{}

var _ memberlist.EventDelegate = poolEvents{}
var _ prometheus.Collector = (*Pool)(nil)
