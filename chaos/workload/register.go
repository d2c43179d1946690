package workload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"

	"github.com/lodestone-kv/lodestone/chaos/check"
	"github.com/lodestone-kv/lodestone/chaos/history"
)

// Register is the register workload: reads, writes and CASes per key.
type Register struct {
	Workers int
	// ActiveKeys is how many keys are in use at once.
	ActiveKeys int
	// MaxOpsPerKey and MaxInfoPerKey retire a key (porcupine's cost grows
	// with history length and, steeply, with unknown outcomes per key).
	MaxOpsPerKey  int
	MaxInfoPerKey int

	pool *keyPool
}

func (r *Register) Name() string { return history.Register }

func (r *Register) Run(ctx context.Context, env *Env) error {
	r.pool = newKeyPool(max(r.ActiveKeys, 1), max(r.MaxOpsPerKey, 10), max(r.MaxInfoPerKey, 1))
	runWorkers(ctx, max(r.Workers, 1), func(ctx context.Context, w int) {
		rng := env.rng(1000 + w)
		proc := env.NewProc()
		for i := 0; i < maxOpsPerWorker && ctx.Err() == nil; i++ {
			key := r.pool.pick(rng)
			var last history.Op
			switch x := rng.IntN(100); {
			case x < 50:
				last = env.read(ctx, env.pick(rng), proc, history.Register, key, false)
			case x < 75:
				last = env.put(ctx, env.pick(rng), proc, history.Register, history.Write, key, env.NextValue(), -1, "")
			default:
				rd := env.read(ctx, env.pick(rng), proc, history.Register, key, false)
				if rd.Type == history.OK {
					prev := ""
					if rd.Found {
						prev = rd.Value
					}
					last = env.put(ctx, env.pick(rng), proc, history.Register, history.CAS, key, env.NextValue(), int64(rd.Index), prev)
				}
			}
			r.pool.done(key, last.Type == history.Info)
			if last.Type == history.Info {
				// Jepsen: a process whose operation is in doubt is
				// retired; its successor is a new process.
				proc = env.NewProc()
			}
			env.think(ctx)
		}
	})
	return nil
}

// Final reads every key the workload used, linearizably, from the leader
// side of a healed cluster; the reads join the history as Final ops.
func (r *Register) Final(ctx context.Context, env *Env) error {
	if r.pool == nil {
		return nil
	}
	proc := env.NewProc()
	rng := env.rng(999)
	for _, k := range r.pool.all() {
		var last history.Op
		for attempt := 0; attempt < 10 && ctx.Err() == nil; attempt++ {
			last = env.read(ctx, env.pick(rng), proc, history.Register, k, true)
			if last.Type == history.OK {
				break
			}
		}
		if last.Type != history.OK {
			return fmt.Errorf("final read of %s: %s", k, last.Err)
		}
	}
	return nil
}

// keyPool hands out register keys and retires them.
type keyPool struct {
	mu       sync.Mutex
	active   []string
	ops      map[string]int
	infos    map[string]int
	next     int
	maxOps   int
	maxInfos int
	used     []string
}

func newKeyPool(n, maxOps, maxInfos int) *keyPool {
	p := &keyPool{ops: map[string]int{}, infos: map[string]int{}, maxOps: maxOps, maxInfos: maxInfos}
	for i := 0; i < n; i++ {
		p.active = append(p.active, p.fresh())
	}
	return p
}

func (p *keyPool) fresh() string {
	k := fmt.Sprintf("%s%05d", check.RegisterPrefix, p.next)
	p.next++
	p.used = append(p.used, k)
	return k
}

func (p *keyPool) pick(r *rand.Rand) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.active[r.IntN(len(p.active))]
}

func (p *keyPool) done(key string, info bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ops[key]++
	if info {
		p.infos[key]++
	}
	if p.ops[key] < p.maxOps && p.infos[key] < p.maxInfos {
		return
	}
	for i, k := range p.active {
		if k == key {
			p.active[i] = p.fresh()
		}
	}
}

func (p *keyPool) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := append([]string(nil), p.used...)
	sort.Strings(out)
	return out
}
