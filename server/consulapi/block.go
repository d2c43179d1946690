package consulapi

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// Dep is what a catalog or session read depends on: the hub events that
// can change it (Key, with Prefix the keys under it) and the store index
// that says whether it did (store/doc.go, "Indices for blocking queries").
// The events are a superset (an instance event also fires when only a
// check changed), so a blocking read re-checks Index on every wake-up and
// goes back to sleep when it has not passed the client's index.
type Dep struct {
	Key    string
	Prefix bool
	// Index is the store index of what the read returns; nil for a KV
	// read (KVDep), whose index is the store's for Key and Prefix.
	Index func(*store.Store) uint64
}

// KVDep is a KV read of key, with prefix of every key under it. It holds
// no closure: a parked blocking query keeps its Dep for its whole wait,
// and every object it holds is one more for each GC cycle to mark.
func KVDep(key string, prefix bool) Dep { return Dep{Key: key, Prefix: prefix} }

// IndexIn returns d's index in st.
func (d Dep) IndexIn(st *store.Store) uint64 {
	if d.Index == nil {
		return st.KVIndexFor([]byte(d.Key), d.Prefix)
	}
	return d.Index(st)
}

// ServicesDep is the service-name list (/v1/catalog/services).
func ServicesDep() Dep {
	return Dep{Key: store.ServiceEventPrefix, Prefix: true, Index: (*store.Store).ServicesIndex}
}

// ServiceDep is one service's instances, their checks and nodes.
func ServiceDep(name string) Dep {
	return Dep{Key: string(store.ServiceEventKeyPrefix(name)), Prefix: true,
		Index: func(s *store.Store) uint64 { return s.ServiceIndex(name) }}
}

// NodesDep is the node list.
func NodesDep() Dep {
	return Dep{Key: store.NodeEventPrefix, Prefix: true, Index: (*store.Store).NodesIndex}
}

// NodeDep is one node with its services and checks.
func NodeDep(name string) Dep {
	return Dep{Key: string(store.NodeEventKey(name)), Index: func(s *store.Store) uint64 { return s.NodeIndex(name) }}
}

// ChecksDep is every check (/v1/health/state/:state).
func ChecksDep() Dep {
	return Dep{Key: store.CheckEventPrefix, Prefix: true, Index: (*store.Store).ChecksIndex}
}

// SessionsDep is the session table (every session read reports its index).
func SessionsDep() Dep {
	return Dep{Key: store.SessionEventPrefix, Prefix: true, Index: (*store.Store).SessionsIndex}
}

// ErrBadWait is wrapped by Block's error for a request the hub refuses.
var ErrBadWait = errors.New("consulapi: bad blocking request")

// Block is the blocking-query wait of every catalog and session read, for
// this API and the native gRPC one: with after == 0 it returns at once;
// otherwise it waits until d's index passes after, or wait (plus up to
// 1/16 jitter, so synchronized clients spread out) elapses, or ctx ends.
// It does not fail for a timeout: the caller then reads and answers with
// the unchanged index, as Consul does.
func Block(ctx context.Context, hub *watch.Hub, st *store.Store, d Dep, after uint64, wait time.Duration) error {
	if after == 0 {
		return nil
	}
	req, changed := waitSpec(st, d, after)
	_, err := hub.WaitFor(ctx, req, jittered(wait), changed)
	if errors.As(err, new(*watch.CompactedError)) {
		// NB: what it waited for is older than the hub holds, or the
		// state was restored since: answer now, as a parked query does.
		return nil
	}
	return badWait(err)
}

// waitSpec is what a blocking read after index after waits for: the hub
// events that may change it, and the check that it did.
func waitSpec(st *store.Store, d Dep, after uint64) (watch.Request, func() bool) {
	// NB: start from the store's index read before the first check, not
	// from the client's: a change at or below it is seen by that check,
	// and the hub then replays nothing. Starting at after would replay the
	// whole retained log since after on every re-issued query, a cost that
	// grows with the write rate times the wait (10k clients re-asking an
	// old index made writes 10x slower).
	req := watch.Request{Key: d.Key, Prefix: d.Prefix, StartIndex: max(after, st.Index())}
	return req, func() bool { return d.IndexIn(st) > after }
}

// jittered adds up to 1/16 to wait, so synchronized clients spread out.
func jittered(wait time.Duration) time.Duration { return wait + rand.N(wait/16+1) }

func badWait(err error) error {
	if errors.Is(err, watch.ErrBadRequest) {
		return errors.Join(ErrBadWait, err)
	}
	return err
}
