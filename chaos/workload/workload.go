// Package workload drives client operations against the chaos cluster and
// records each one in the history: invocation time, completion time,
// outcome (ok, fail, info) and result.
//
// # What it owns
//
// The worker goroutines of each workload (started by Run, all ended when
// Run returns) and the watcher streams. Workers talk raw gRPC to one chosen
// node per operation, with an explicit per-operation timeout, so that a
// read really is served by the node the history says (the Go client would
// prefer the leader and retry, hiding a stale follower).
//
// # Workloads
//
//   - register: reads, blind writes and CASes on a rotating set of keys;
//     every value is unique, so the checker's value-CAS equals the server's
//     ModifyIndex-CAS. A key is retired after MaxOpsPerKey operations or
//     MaxInfoPerKey unknown outcomes, which bounds porcupine's search.
//   - counter: read, then CAS value+1 on the ModifyIndex read.
//   - set: write-once keys, for the durability checker.
//   - watch: Watch streams on the workload prefix, resumed from the last
//     index on error and on purpose every few seconds, on random nodes.
//
// A lock workload (sessions) plugs in as one more Workload plus a Checker
// in chaos/check.
package workload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/chaos/cluster"
	"github.com/lodestone-kv/lodestone/chaos/history"
	"github.com/lodestone-kv/lodestone/client"
)

// Workload is one kind of client activity.
type Workload interface {
	Name() string
	// Run issues operations until ctx ends, recording each in env.H. It
	// returns only when every goroutine it started has ended.
	Run(ctx context.Context, env *Env) error
	// Final records what the checkers need once the cluster is healed
	// (e.g. a final read of every key, as Final ops).
	Final(ctx context.Context, env *Env) error
}

// Env is what workloads share.
type Env struct {
	H      *history.History
	Nodes  []*cluster.Node
	Logger *slog.Logger
	// OpTimeout bounds one operation. Default 2s.
	OpTimeout time.Duration
	// Think is the pause between one worker's operations. Default 10ms.
	Think time.Duration
	// StaleReads makes every read ask for STALE consistency: a self-test
	// of the harness that must make the checkers report anomalies.
	StaleReads bool
	// Seed drives every random choice.
	Seed uint64

	procs  atomic.Int64
	values atomic.Int64
	reads  atomic.Int64
}

// NewProc returns a fresh logical client id.
func (e *Env) NewProc() int { return int(e.procs.Add(1) - 1) }

// NextValue returns a value never used before in this campaign.
func (e *Env) NextValue() string { return fmt.Sprintf("v%d", e.values.Add(1)) }

func (e *Env) rng(worker int) *rand.Rand {
	return rand.New(rand.NewPCG(e.Seed, uint64(worker)*0x9e3779b97f4a7c15+1))
}

func (e *Env) opTimeout() time.Duration {
	if e.OpTimeout <= 0 {
		return 2 * time.Second
	}
	return e.OpTimeout
}

func (e *Env) think(ctx context.Context) {
	d := e.Think
	if d <= 0 {
		d = 10 * time.Millisecond
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (e *Env) consistency() lodestonepb.Consistency {
	if e.StaleReads {
		return lodestonepb.Consistency_STALE
	}
	return lodestonepb.Consistency_LINEARIZABLE
}

// pick returns a random node slot.
func (e *Env) pick(r *rand.Rand) *cluster.Node { return e.Nodes[r.IntN(len(e.Nodes))] }

// read performs and records one Get.
func (e *Env) read(ctx context.Context, n *cluster.Node, proc int, workload, key string, final bool) history.Op {
	op := history.Op{Proc: proc, Workload: workload, F: history.Read, Key: key, Node: n.Name(), Final: final}
	e.H.Invoke(&op)
	cctx, cancel := context.WithTimeout(ctx, e.opTimeout())
	resp, err := e.get(cctx, n, key)
	cancel()
	if err != nil {
		op.Type, op.Err = history.Fail, errText(err)
	} else {
		op.Type = history.OK
		if resp.Kv != nil {
			op.Found, op.Value, op.Index = true, string(resp.Kv.Value), resp.Kv.ModifyIndex
		}
	}
	e.H.Complete(op)
	return op
}

// get reads key on n in turn as a Get, a GetMany of that one key, and a
// GetStream request of it, so the checkers judge the read paths coalesced
// Gets take as well.
func (e *Env) get(ctx context.Context, n *cluster.Node, key string) (*lodestonepb.GetResponse, error) {
	kv := lodestonepb.NewKVClient(n.Conn)
	req := &lodestonepb.GetManyRequest{Keys: [][]byte{[]byte(key)}, Consistency: e.consistency()}
	var resp *lodestonepb.GetManyResponse
	var err error
	switch e.reads.Add(1) % 3 {
	case 0:
		return kv.Get(ctx, &lodestonepb.GetRequest{Key: []byte(key), Consistency: e.consistency()})
	case 1:
		resp, err = kv.GetMany(ctx, req)
	default:
		resp, err = streamGet(ctx, kv, req)
	}
	if err != nil {
		return nil, err
	}
	if len(resp.Results) != 1 || !resp.Results[0].Served {
		return nil, fmt.Errorf("GetMany of %q: %d results, the first served: %v", key, len(resp.Results), len(resp.Results) > 0 && resp.Results[0].Served)
	}
	return &lodestonepb.GetResponse{Header: resp.Header, Kv: resp.Results[0].Kv}, nil
}

// streamGet asks req as the one request of a GetStream of its own.
func streamGet(ctx context.Context, kv lodestonepb.KVClient, req *lodestonepb.GetManyRequest) (*lodestonepb.GetManyResponse, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := kv.GetStream(sctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(req); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	resp, err := st.Recv()
	if errors.Is(err, io.EOF) {
		return nil, errors.New("the get stream ended without an answer")
	}
	return resp, err
}

// put performs and records one Put; cas < 0 means unconditional.
func (e *Env) put(ctx context.Context, n *cluster.Node, proc int, workload, f, key, value string, cas int64, prev string) history.Op {
	op := history.Op{Proc: proc, Workload: workload, F: f, Key: key, Value: value, Node: n.Name()}
	req := &lodestonepb.PutRequest{Key: []byte(key), Value: []byte(value)}
	if cas >= 0 {
		idx := uint64(cas)
		req.Cas = &idx
		op.Prev, op.PrevIndex = prev, idx
	}
	e.H.Invoke(&op)
	tctx, tr := client.WithRPCTrace(ctx)
	cctx, cancel := context.WithTimeout(tctx, e.opTimeout())
	resp, err := lodestonepb.NewKVClient(n.Conn).Put(cctx, req)
	cancel()
	op.Type, op.Mismatch = classifyWrite(err, tr)
	op.Err = errText(err)
	if err == nil {
		op.Index = resp.GetKv().GetModifyIndex()
		if op.Index == 0 {
			op.Index = resp.GetHeader().GetIndex()
		}
	}
	e.H.Complete(op)
	return op
}

// runWorkers runs n copies of fn and waits for all of them.
func runWorkers(ctx context.Context, n int, fn func(ctx context.Context, worker int)) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(ctx, i)
		}()
	}
	wg.Wait()
}

// maxOpsPerWorker bounds every worker loop in count as ctx bounds it in
// time.
const maxOpsPerWorker = 1_000_000
