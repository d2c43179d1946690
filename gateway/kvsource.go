package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

// KVSource is a Source over Lodestone's KV store, for users who feed
// instances by KV rather than the catalog: instances are JSON values (see
// Instance) under
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
	feedRunner
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

// withDefaults returns c with every zero field set to its default.
func (c KVSourceConfig) withDefaults() KVSourceConfig {
	d := DefaultKVSourceConfig()
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	if c.GiveUpAfter == 0 {
		c.GiveUpAfter = d.GiveUpAfter
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = d.BackoffBase
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = max(d.BackoffMax, c.BackoffBase)
	}
	if c.PageSize == 0 {
		c.PageSize = d.PageSize
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// NewKVSource returns a source reading through c (which the caller owns
// and closes).
func NewKVSource(c *client.Client, cfg KVSourceConfig) (*KVSource, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &KVSource{c: c, cfg: cfg, log: cfg.Logger, feedRunner: feedRunner{cfg: cfg, log: cfg.Logger}}, nil
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

// Stats returns how the source (re)joined the registry so far.
func (s *KVSource) Stats() SourceStats { return s.stats() }

// Run implements Source.
func (s *KVSource) Run(ctx context.Context, from uint64, sink Sink) error {
	return s.run(ctx, &kvFeed{s: s, last: from}, from == 0, sink)
}

// kvFeed is one Run of a KVSource: instances and routes under the prefix.
type kvFeed struct {
	s    *KVSource
	last uint64 // index delivered last: the resume point
}

func (f *kvFeed) resumeIndex() uint64             { return f.last }
func (f *kvFeed) what() string                    { return fmt.Sprintf("%q", f.s.cfg.Prefix) }
func (f *kvFeed) probe(ctx context.Context) error { return f.s.probe(ctx) }

// reload reads the whole prefix as one Reset update.
func (f *kvFeed) reload(ctx context.Context) (Update, error) {
	u := Update{Reset: true}
	idx, err := f.s.read(ctx, f.s.cfg.Prefix, &u)
	if err != nil {
		return Update{}, err
	}
	f.s.log.Info("gateway: loaded routes and instances from the registry", "index", idx,
		"instances", len(u.Instances), "routes", len(u.Routes))
	f.last = idx
	return u, nil
}

// follow watches the prefix from f.last, delivering every batch, until
// the watch ends.
func (f *kvFeed) follow(ctx context.Context, sink Sink) error {
	w := f.s.watch(ctx, f.s.cfg.Prefix, f.last)
	defer w.Close()
	for {
		b, err := w.Next(ctx)
		if err != nil {
			return err
		}
		u := Update{Index: b.Index}
		for _, ev := range b.Events {
			f.s.decode(&u, ev.GetType(), ev.GetKv())
		}
		sink.Apply(u)
		f.last = b.Index
	}
}

// watch starts a prefix watch from index from with progress batches.
func (s *KVSource) watch(ctx context.Context, prefix string, from uint64) *client.Watch {
	return s.c.Watch(ctx, prefix, client.WatchPrefix(), client.FromIndex(from),
		client.WithProgressNotify(), client.WatchGiveUpAfter(s.cfg.GiveUpAfter))
}

// probe checks that some registry answers before a resume is reported
// connected.
func (s *KVSource) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.GiveUpAfter)
	defer cancel()
	_, err := s.c.Range(ctx, s.cfg.Prefix, client.Limit(1), client.KeysOnly(), client.Stale())
	return err
}

// read pages through prefix (under cfg.Prefix), adding every entry to u
// and setting u.Index, and returns the index to follow from: the first
// page's, which is the applied index of the read (events after it are
// replayed over later pages, which converges because each event carries
// the whole value).
func (s *KVSource) read(ctx context.Context, prefix string, u *Update) (uint64, error) {
	var (
		first uint64
		after string
	)
	for {
		opts := []client.RangeOption{client.Limit(s.cfg.PageSize)}
		if after != "" {
			opts = append(opts, client.StartAfter(after))
		}
		resp, err := s.c.Range(ctx, prefix, opts...)
		if err != nil {
			return 0, fmt.Errorf("read %q: %w", prefix, err)
		}
		if first == 0 {
			first = resp.GetHeader().GetIndex()
		}
		for _, kv := range resp.GetKvs() {
			s.decode(u, lodestonepb.Event_PUT, kv)
		}
		kvs := resp.GetKvs()
		if !resp.GetMore() || len(kvs) == 0 {
			break
		}
		after = string(kvs[len(kvs)-1].GetKey())
	}
	u.Index = first
	return first, nil
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
