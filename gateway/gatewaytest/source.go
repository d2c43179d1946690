package gatewaytest

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sort"
	"sync"

	"github.com/lodestone-kv/lodestone/gateway"
)

// ErrDisconnected is the error a disconnected Source reports to its sink.
var ErrDisconnected = errors.New("gatewaytest: source disconnected")

// Source is an in-memory gateway.Source: a registry of instances and
// routes where every write takes the next index, with a history that Run
// replays to resume, and switches for the failures a real registry has
// (Disconnect, Compact). It is safe for concurrent use; Run may be called
// again after it returned.
type Source struct {
	mu        sync.Mutex
	index     uint64
	instances map[string]gateway.Instance // by service + "/" + id
	routes    map[string]gateway.Route
	history   []write // every write, in index order
	compacted uint64  // resuming from below this gets a Reset
	connected bool
	changed   chan struct{} // closed and replaced on every change
	runs      int
	resets    int
}

// write is one recorded change.
type write struct {
	index    uint64
	service  string // "" for a route write
	id       string
	instance *gateway.Instance
	set      []gateway.Instance // ReplaceService
	isSet    bool
	route    *gateway.Route
}

var _ gateway.Source = (*Source)(nil)

// NewSource returns an empty, connected source at index 0.
func NewSource() *Source {
	return &Source{
		instances: map[string]gateway.Instance{}, routes: map[string]gateway.Route{},
		connected: true, changed: make(chan struct{}),
	}
}

func (s *Source) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Source) record(w write) uint64 {
	s.index++
	w.index = s.index
	s.history = append(s.history, w)
	s.notifyLocked()
	return s.index
}

// PutInstance registers (or updates) in and returns its index.
func (s *Source) PutInstance(in gateway.Instance) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.instances[in.Service+"/"+in.ID] = in
	return s.record(write{service: in.Service, id: in.ID, instance: &in})
}

// DeleteInstance deregisters service/id and returns the index.
func (s *Source) DeleteInstance(service, id string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.instances, service+"/"+id)
	return s.record(write{service: service, id: id})
}

// ReplaceService replaces service's whole instance set (a catalog-style
// full set) and returns the index.
func (s *Source) ReplaceService(service string, ins []gateway.Instance) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, in := range s.instances {
		if in.Service == service {
			delete(s.instances, k)
		}
	}
	set := make([]gateway.Instance, 0, len(ins))
	for _, in := range ins {
		in.Service = service
		s.instances[service+"/"+in.ID] = in
		set = append(set, in)
	}
	return s.record(write{service: service, set: set, isSet: true})
}

// PutRoute stores a route and returns its index.
func (s *Source) PutRoute(r gateway.Route) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routes[r.Name] = r
	return s.record(write{id: r.Name, route: &r})
}

// DeleteRoute removes a route and returns its index.
func (s *Source) DeleteRoute(name string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.routes, name)
	return s.record(write{id: name})
}

// Index returns the latest index.
func (s *Source) Index() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.index
}

// Compact forgets the history: a Run resuming from an older index gets
// one Reset update, as from a registry whose history was compacted.
func (s *Source) Compact() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.compacted = s.index + 1
	s.history = nil
}

// Disconnect makes running Runs report SetConnected(false) and deliver
// nothing until Reconnect, like a registry outage.
func (s *Source) Disconnect() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.connected = false
	s.notifyLocked()
}

// Reconnect ends an outage; Runs resume where they were.
func (s *Source) Reconnect() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.connected = true
	s.notifyLocked()
}

// Runs counts calls of Run; Resets counts Reset updates delivered.
func (s *Source) Runs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs
}

// Resets counts the Reset updates Run delivered (full loads).
func (s *Source) Resets() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resets
}

// Run implements gateway.Source.
func (s *Source) Run(ctx context.Context, from uint64, sink gateway.Sink) error {
	s.mu.Lock()
	s.runs++
	s.mu.Unlock()
	pos := from
	const unknown, up, down = 0, 1, 2
	told := unknown // what the sink was last told
	connect := func() {
		if told != up {
			sink.SetConnected(true, nil)
			told = up
		}
	}
	for {
		s.mu.Lock()
		ch := s.changed
		if !s.connected {
			s.mu.Unlock()
			if told != down {
				sink.SetConnected(false, ErrDisconnected)
				told = down
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-ch:
			}
			continue
		}
		if pos == 0 || pos < s.compacted {
			u := s.snapshotLocked()
			s.resets++
			pos = u.Index
			s.mu.Unlock()
			sink.Apply(u)
			connect()
			continue
		}
		i := sort.Search(len(s.history), func(i int) bool { return s.history[i].index > pos })
		pending := slices.Clone(s.history[i:])
		s.mu.Unlock()
		connect()
		for _, w := range pending {
			sink.Apply(w.update())
			pos = w.index
		}
		if len(pending) == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-ch:
			}
		}
	}
}

// update renders w as a fresh Update (the sink owns what it gets).
func (w write) update() gateway.Update {
	u := gateway.Update{Index: w.index}
	switch {
	case w.isSet:
		u.Sets = []gateway.ServiceSet{{Service: w.service, Instances: slices.Clone(w.set)}}
	case w.service != "":
		c := gateway.InstanceChange{Service: w.service, ID: w.id}
		if w.instance != nil {
			in := *w.instance
			c.Instance = &in
		}
		u.Instances = []gateway.InstanceChange{c}
	default:
		c := gateway.RouteChange{Name: w.id}
		if w.route != nil {
			r := *w.route
			c.Route = &r
		}
		u.Routes = []gateway.RouteChange{c}
	}
	return u
}

func (s *Source) snapshotLocked() gateway.Update {
	u := gateway.Update{Index: s.index, Reset: true}
	for _, k := range slices.Sorted(maps.Keys(s.instances)) {
		in := s.instances[k]
		u.Instances = append(u.Instances, gateway.InstanceChange{Service: in.Service, ID: in.ID, Instance: &in})
	}
	for _, name := range slices.Sorted(maps.Keys(s.routes)) {
		r := s.routes[name]
		u.Routes = append(u.Routes, gateway.RouteChange{Name: name, Route: &r})
	}
	return u
}
