package workload

import (
	"context"
	"fmt"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/chaos/check"
	"github.com/lodestone-kv/lodestone/chaos/cluster"
	"github.com/lodestone-kv/lodestone/chaos/history"
)

// ReadFinal reads every workload key after the final heal: once
// linearizably (through the leader when one is known), then from each node
// with STALE once that node has applied the linearizable read's index.
func ReadFinal(ctx context.Context, env *Env, c *cluster.Cluster) history.FinalState {
	fin := history.FinalState{}
	var lastErr error
	for attempt := 0; attempt < 20 && ctx.Err() == nil; attempt++ {
		n, _ := c.Leader(ctx)
		if n == nil {
			n = env.Nodes[attempt%len(env.Nodes)]
		}
		kvs, index, err := rangeAll(ctx, n, lodestonepb.Consistency_LINEARIZABLE)
		if err == nil {
			fin.KVs, fin.Index, fin.Complete = kvs, index, true
			break
		}
		lastErr = fmt.Errorf("linearizable range on %s: %w", n.Name(), err)
		time.Sleep(500 * time.Millisecond)
	}
	if !fin.Complete {
		if lastErr == nil {
			lastErr = ctx.Err()
		}
		fin.Err = fmt.Sprint(lastErr)
		return fin
	}
	fin.Replicas = map[string]map[string]history.FinalKV{}
	for _, n := range env.Nodes {
		if !n.IsMember() {
			continue
		}
		if err := waitApplied(ctx, c, n, fin.Index, 20*time.Second); err != nil {
			env.H.Note("final: replica %s not compared: %v", n.Name(), err)
			continue
		}
		kvs, _, err := rangeAll(ctx, n, lodestonepb.Consistency_STALE)
		if err != nil {
			env.H.Note("final: replica %s not compared: %v", n.Name(), err)
			continue
		}
		fin.Replicas[n.Name()] = kvs
	}
	return fin
}

func waitApplied(ctx context.Context, c *cluster.Cluster, n *cluster.Node, index uint64, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last uint64
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if st, err := c.Status(ctx, n); err == nil {
			last = st.AppliedIndex
			if last >= index {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("applied %d, not %d, within %v", last, index, within)
}

// rangeAll pages through every workload key.
func rangeAll(ctx context.Context, n *cluster.Node, c lodestonepb.Consistency) (map[string]history.FinalKV, uint64, error) {
	out := map[string]history.FinalKV{}
	var after []byte
	var index uint64
	for page := 0; page < 100_000; page++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := lodestonepb.NewKVClient(n.Conn).Range(cctx, &lodestonepb.RangeRequest{
			Prefix: []byte(check.Prefix), Limit: 500, Consistency: c, StartAfter: after,
		})
		cancel()
		if err != nil {
			return nil, 0, err
		}
		index = max(index, resp.GetHeader().GetIndex())
		for _, kv := range resp.Kvs {
			out[string(kv.Key)] = history.FinalKV{Value: string(kv.Value), Index: kv.ModifyIndex}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, index, nil
		}
		after = resp.Kvs[len(resp.Kvs)-1].Key
	}
	return nil, 0, fmt.Errorf("range did not end within 100000 pages")
}
