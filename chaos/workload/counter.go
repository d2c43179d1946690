package workload

import (
	"context"
	"fmt"
	"strconv"

	"github.com/lodestone-kv/lodestone/chaos/check"
	"github.com/lodestone-kv/lodestone/chaos/history"
)

// CounterKey is the CAS counter's key.
const CounterKey = check.CounterPrefix + "0"

// Counter increments one key with read + CAS(ModifyIndex) and reads it.
type Counter struct {
	Workers int
}

func (c *Counter) Name() string { return history.Counter }

func (c *Counter) Run(ctx context.Context, env *Env) error {
	runWorkers(ctx, max(c.Workers, 1), func(ctx context.Context, w int) {
		rng := env.rng(2000 + w)
		proc := env.NewProc()
		for i := 0; i < maxOpsPerWorker && ctx.Err() == nil; i++ {
			rd := env.read(ctx, env.pick(rng), proc, history.Counter, CounterKey, false)
			if rd.Type == history.OK && rng.IntN(4) != 0 {
				n := 0
				if rd.Found {
					n, _ = strconv.Atoi(rd.Value)
				}
				add := env.put(ctx, env.pick(rng), proc, history.Counter, history.Add, CounterKey, strconv.Itoa(n+1), int64(rd.Index), rd.Value)
				if add.Type == history.Info {
					proc = env.NewProc()
				}
			}
			env.think(ctx)
		}
	})
	return nil
}

func (c *Counter) Final(ctx context.Context, env *Env) error {
	proc := env.NewProc()
	rng := env.rng(2999)
	for attempt := 0; attempt < 10 && ctx.Err() == nil; attempt++ {
		if env.read(ctx, env.pick(rng), proc, history.Counter, CounterKey, true).Type == history.OK {
			return nil
		}
	}
	return fmt.Errorf("final read of %s failed 10 times", CounterKey)
}

// Set writes each key once, for the durability checker.
type Set struct {
	Workers int
}

func (s *Set) Name() string { return history.Set }

func (s *Set) Run(ctx context.Context, env *Env) error {
	runWorkers(ctx, max(s.Workers, 1), func(ctx context.Context, w int) {
		rng := env.rng(3000 + w)
		proc := env.NewProc()
		for i := 0; i < maxOpsPerWorker && ctx.Err() == nil; i++ {
			key := fmt.Sprintf("%s%d/%07d", check.SetPrefix, w, i)
			op := env.put(ctx, env.pick(rng), proc, history.Set, history.Write, key, env.NextValue(), -1, "")
			if op.Type == history.Info {
				proc = env.NewProc()
			}
			env.think(ctx)
		}
	})
	return nil
}

// Final has nothing to add: the final range read covers the set.
func (s *Set) Final(context.Context, *Env) error { return nil }
