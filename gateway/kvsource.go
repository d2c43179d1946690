package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

// KVSource is a Source over Lodestone's KV store, usable before the
// catalog is: instances are JSON values (see Instance) under
//
//	<Prefix>instances/<service>/<id>
//
// and routes JSON values (see Route) under <Prefix>routes/<name>. It reads
// both with one paged Range, then follows both with ONE prefix watch on
// <Prefix>, resuming from the last index it delivered whenever the watch
// breaks; only a resume index the registry no longer retains forces
// another full read.
type KVSource struct {
	c   *client.Client
	cfg KVSourceConfig
	log *slog.Logger

	reloads atomic.Int64
	resumes atomic.Int64
}

var _ Source = (*KVSource)(nil)

// KVSourceConfig configures a KVSource.
type KVSourceConfig struct {
	// Prefix holds "instances/" and "routes/". Must end in "/".
	// Default "gateway/".
	Prefix string
	// GiveUpAfter is how long the watch may go without a serving registry
	// before the source reports itself disconnected (and the gateway's
	// staleness starts to count). The client keeps failing over between
	// endpoints during it. Default 3s. Shorter reports outages sooner and
	// flaps on a leader election.
	GiveUpAfter time.Duration
	// BackoffBase and BackoffMax bound the jittered, exponential wait
	// between attempts to reach a registry that is down. Defaults 200ms
	// and 5s.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// PageSize is the keys per Range page of a full read. Default 1000.
	PageSize uint32
	// Logger receives reloads and connection changes at Info, bad values
	// at Warn. nil discards.
	Logger *slog.Logger
}

// DefaultKVSourceConfig returns the defaults documented on each field.
func DefaultKVSourceConfig() KVSourceConfig {
	return KVSourceConfig{
		Prefix:      "gateway/",
		GiveUpAfter: 3 * time.Second,        // a leader election fits inside
		BackoffBase: 200 * time.Millisecond, // first retry of a down registry
		BackoffMax:  5 * time.Second,        // every gateway retries at most every ~5s
		PageSize:    1000,
	}
}

// Validate reports the first invalid field as a *ConfigError.
func (c KVSourceConfig) Validate() error {
	switch {
	case c.Prefix != "" && !strings.HasSuffix(c.Prefix, "/"):
		return &ConfigError{Field: "KVSource.Prefix", Reason: fmt.Sprintf("%q must end with '/'", c.Prefix)}
	case c.GiveUpAfter < 0 || c.BackoffBase < 0 || c.BackoffMax < 0:
		return &ConfigError{Field: "KVSource", Reason: "negative duration"}
	case c.BackoffBase > 0 && c.BackoffMax > 0 && c.BackoffBase > c.BackoffMax:
		return &ConfigError{Field: "KVSource.BackoffBase", Reason: "exceeds BackoffMax"}
	}
	return nil
}

// NewKVSource returns a source reading through c (which the caller owns
// and closes).
func NewKVSource(c *client.Client, cfg KVSourceConfig) (*KVSource, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := DefaultKVSourceConfig()
	if cfg.Prefix == "" {
		cfg.Prefix = d.Prefix
	}
	if cfg.GiveUpAfter == 0 {
		cfg.GiveUpAfter = d.GiveUpAfter
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = d.BackoffBase
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = max(d.BackoffMax, cfg.BackoffBase)
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = d.PageSize
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &KVSource{c: c, cfg: cfg, log: log}, nil
}

// InstanceKey returns the KV key of an instance.
func (s *KVSource) InstanceKey(service, id string) string {
	return s.cfg.Prefix + "instances/" + service + "/" + id
}

// RouteKey returns the KV key of a registry route.
func (s *KVSource) RouteKey(name string) string { return s.cfg.Prefix + "routes/" + name }

// PutInstance registers (or updates) in under in.Service/in.ID and returns
// the write's index.
func (s *KVSource) PutInstance(ctx context.Context, in Instance) (uint64, error) {
	if in.Service == "" || in.ID == "" || strings.Contains(in.Service, "/") || strings.Contains(in.ID, "/") {
		return 0, fmt.Errorf("gateway: instance needs a service and an id without '/' (got %q/%q)", in.Service, in.ID)
	}
	v, err := json.Marshal(Instance{Address: in.Address, Port: in.Port, Healthy: in.Healthy, Meta: in.Meta})
	if err != nil {
		return 0, err
	}
	resp, err := s.c.Put(ctx, s.InstanceKey(in.Service, in.ID), v)
	if err != nil {
		return 0, err
	}
	return resp.GetHeader().GetIndex(), nil
}

// DeleteInstance deregisters service/id and returns the write's index.
func (s *KVSource) DeleteInstance(ctx context.Context, service, id string) (uint64, error) {
	resp, err := s.c.Delete(ctx, s.InstanceKey(service, id))
	if err != nil {
		return 0, err
	}
	return resp.GetHeader().GetIndex(), nil
}

// PutRoute stores a registry route and returns the write's index.
func (s *KVSource) PutRoute(ctx context.Context, r Route) (uint64, error) {
	if err := r.Validate(); err != nil {
		return 0, err
	}
	v, err := json.Marshal(r)
	if err != nil {
		return 0, err
	}
	resp, err := s.c.Put(ctx, s.RouteKey(r.Name), v)
	if err != nil {
		return 0, err
	}
	return resp.GetHeader().GetIndex(), nil
}

// DeleteRoute removes a registry route and returns the write's index.
func (s *KVSource) DeleteRoute(ctx context.Context, name string) (uint64, error) {
	resp, err := s.c.Delete(ctx, s.RouteKey(name))
	if err != nil {
		return 0, err
	}
	return resp.GetHeader().GetIndex(), nil
}

// KVSourceStats counts how the source (re)joined the registry.
type KVSourceStats struct {
	Reloads int64 // full reads (Range); 1 for a fresh start
	Resumes int64 // watches re-created from the last index after a break
}

// Stats returns the counts so far.
func (s *KVSource) Stats() KVSourceStats {
	return KVSourceStats{Reloads: s.reloads.Load(), Resumes: s.resumes.Load()}
}

// Run implements Source.
func (s *KVSource) Run(ctx context.Context, from uint64, sink Sink) error {
	last := from
	reload := from == 0
	failures := 0
	for {
		var err error
		if reload {
			var idx uint64
			if idx, err = s.reload(ctx, sink); err == nil {
				last, reload = idx, false
			}
		} else {
			err = s.probe(ctx)
		}
		if err == nil {
			failures = 0
			sink.SetConnected(true, nil)
			err = s.follow(ctx, &last, sink)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case errors.Is(err, client.ErrCompacted):
			s.log.Info("gateway: resume index no longer retained by the registry; reloading", "index", last, "err", err)
			reload = true
			continue
		case errors.Is(err, client.ErrInvalidArgument), errors.Is(err, client.ErrWatchCanceled):
			sink.SetConnected(false, err)
			return fmt.Errorf("watch %q: %w", s.cfg.Prefix, err)
		}
		sink.SetConnected(false, err)
		failures++
		d := backoffDelay(failures, s.cfg.BackoffBase, s.cfg.BackoffMax)
		s.log.Debug("gateway: registry unreachable; retrying", "in", d, "index", last, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
		if !reload {
			s.resumes.Add(1)
		}
	}
}

// backoffDelay is the jittered exponential delay before retry n (≥ 1):
// uniformly in [d/2, d] with d = base × 2^(n-1) capped at max.
func backoffDelay(n int, base, maxD time.Duration) time.Duration {
	d := base
	for i := 1; i < n && d < maxD; i++ {
		d *= 2
	}
	d = min(d, maxD)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// probe checks that some registry answers before a resume is reported
// connected.
func (s *KVSource) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.GiveUpAfter)
	defer cancel()
	_, err := s.c.Range(ctx, s.cfg.Prefix, client.Limit(1), client.KeysOnly(), client.Stale())
	return err
}

// reload reads the whole prefix and delivers it as one Reset update. It
// returns the index to follow from: the first page's (events after it are
// replayed over later pages, which converges because each event carries
// the whole value).
func (s *KVSource) reload(ctx context.Context, sink Sink) (uint64, error) {
	var (
		first uint64
		after string
		u     = Update{Reset: true}
	)
	for {
		opts := []client.RangeOption{client.Limit(s.cfg.PageSize)}
		if after != "" {
			opts = append(opts, client.StartAfter(after))
		}
		resp, err := s.c.Range(ctx, s.cfg.Prefix, opts...)
		if err != nil {
			return 0, fmt.Errorf("read %q: %w", s.cfg.Prefix, err)
		}
		if first == 0 {
			first = resp.GetHeader().GetIndex()
		}
		for _, kv := range resp.GetKvs() {
			s.decode(&u, lodestonepb.Event_PUT, kv)
		}
		kvs := resp.GetKvs()
		if !resp.GetMore() || len(kvs) == 0 {
			break
		}
		after = string(kvs[len(kvs)-1].GetKey())
	}
	u.Index = first
	s.reloads.Add(1)
	s.log.Info("gateway: loaded routes and instances from the registry", "index", first,
		"instances", len(u.Instances), "routes", len(u.Routes))
	sink.Apply(u)
	return first, nil
}

// follow watches the prefix from *last, delivering every batch, until the
// watch ends; *last tracks the index delivered.
func (s *KVSource) follow(ctx context.Context, last *uint64, sink Sink) error {
	w := s.c.Watch(ctx, s.cfg.Prefix, client.WatchPrefix(), client.FromIndex(*last),
		client.WithProgressNotify(), client.WatchGiveUpAfter(s.cfg.GiveUpAfter))
	defer w.Close()
	for {
		b, err := w.Next(ctx)
		if err != nil {
			return err
		}
		u := Update{Index: b.Index}
		for _, ev := range b.Events {
			s.decode(&u, ev.GetType(), ev.GetKv())
		}
		sink.Apply(u)
		*last = b.Index
	}
}

// decode adds one KV event to u. Keys outside instances/ and routes/ are
// ignored; a value that does not parse removes the entry (and is logged),
// so one bad write cannot leave a stale origin in service.
func (s *KVSource) decode(u *Update, typ lodestonepb.Event_Type, kv *lodestonepb.KeyValue) {
	key := string(kv.GetKey())
	rest, ok := strings.CutPrefix(key, s.cfg.Prefix)
	if !ok {
		return
	}
	switch {
	case strings.HasPrefix(rest, "instances/"):
		svc, id, ok := strings.Cut(strings.TrimPrefix(rest, "instances/"), "/")
		if !ok || svc == "" || id == "" || strings.Contains(id, "/") {
			s.log.Warn("gateway: ignoring key: want <prefix>instances/<service>/<id>", "key", key)
			return
		}
		ch := InstanceChange{Service: svc, ID: id}
		if typ == lodestonepb.Event_PUT {
			var in Instance
			if err := json.Unmarshal(kv.GetValue(), &in); err != nil {
				s.log.Warn("gateway: bad instance value; treating the instance as gone", "key", key, "err", err)
			} else {
				in.Service, in.ID = svc, id
				ch.Instance = &in
			}
		}
		u.Instances = append(u.Instances, ch)
	case strings.HasPrefix(rest, "routes/"):
		name := strings.TrimPrefix(rest, "routes/")
		if name == "" || strings.Contains(name, "/") {
			s.log.Warn("gateway: ignoring key: want <prefix>routes/<name>", "key", key)
			return
		}
		ch := RouteChange{Name: name}
		if typ == lodestonepb.Event_PUT {
			var r Route
			if err := json.Unmarshal(kv.GetValue(), &r); err != nil {
				s.log.Warn("gateway: bad route value; treating the route as gone", "key", key, "err", err)
			} else {
				r.Name = name
				ch.Route = &r
			}
		}
		u.Routes = append(u.Routes, ch)
	}
}
