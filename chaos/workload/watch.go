package workload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/chaos/check"
	"github.com/lodestone-kv/lodestone/chaos/cluster"
	"github.com/lodestone-kv/lodestone/chaos/history"
)

// Watch runs watchers on the workload prefix. Each watcher is a chain of
// sessions (streams) on random nodes; a session ends on a stream error or
// after a random lifetime, and the next resumes from the last index seen.
type Watch struct {
	Watchers int
	// MinLife and MaxLife bound a session's planned lifetime.
	MinLife, MaxLife time.Duration

	mu   sync.Mutex
	ends map[int]uint64
	// disabled is set when the server does not serve Watch.
	disabled atomic.Bool
}

func (w *Watch) Name() string { return "watch" }

// Disabled reports whether the server turned out not to serve Watch.
func (w *Watch) Disabled() bool { return w.disabled.Load() }

// Run watches until ctx ends.
func (w *Watch) Run(ctx context.Context, env *Env) error {
	w.mu.Lock()
	w.ends = map[int]uint64{}
	w.mu.Unlock()
	start, err := w.currentIndex(ctx, env, env.rng(4999))
	if err != nil {
		return fmt.Errorf("watch start index: %w", err)
	}
	runWorkers(ctx, max(w.Watchers, 1), func(ctx context.Context, id int) {
		w.watcher(ctx, env, id, start)
	})
	return nil
}

// currentIndex reads the workload prefix linearizably; its header index is
// where a (re)loading watcher starts.
func (w *Watch) currentIndex(ctx context.Context, env *Env, rng *rand.Rand) (uint64, error) {
	var last error
	for attempt := 0; attempt < 50 && ctx.Err() == nil; attempt++ {
		n := env.pick(rng)
		cctx, cancel := context.WithTimeout(ctx, env.opTimeout())
		resp, err := lodestonepb.NewKVClient(n.Conn).Range(cctx, &lodestonepb.RangeRequest{Prefix: []byte(check.Prefix), Limit: 1, KeysOnly: true})
		cancel()
		if err == nil {
			return resp.GetHeader().GetIndex(), nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	if last == nil {
		last = ctx.Err()
	}
	return 0, last
}

func (w *Watch) setEnd(id int, end uint64) {
	w.mu.Lock()
	w.ends[id] = max(w.ends[id], end)
	w.mu.Unlock()
}

// CaughtUp reports whether every watcher has seen everything up to index.
func (w *Watch) CaughtUp(index uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id := 0; id < max(w.Watchers, 1); id++ {
		if w.ends[id] < index {
			return false
		}
	}
	return true
}

func (w *Watch) watcher(ctx context.Context, env *Env, id int, start uint64) {
	rng := env.rng(5000 + id)
	reload := false
	minLife, maxLife := w.MinLife, w.MaxLife
	if minLife <= 0 {
		minLife = 2 * time.Second
	}
	if maxLife <= minLife {
		maxLife = minLife + 4*time.Second
	}
	for session := 0; session < 100_000 && ctx.Err() == nil && !w.disabled.Load(); session++ {
		n := env.pick(rng)
		s := history.WatchSession{Watcher: id, Session: session, Node: n.Name(), Start: start, End: start, Reload: reload, Began: env.H.Now()}
		life := minLife + time.Duration(rng.Int64N(int64(maxLife-minLife)))
		reloadAt, err := w.stream(ctx, env, n, &s, life)
		s.Ended = env.H.Now()
		if err != nil {
			s.Reason = err.Error()
		}
		env.H.RecordSession(s)
		switch {
		case reloadAt > 0:
			// The history we asked for is gone: reload and start over
			// from the current index (the checker allows the skip).
			idx, rerr := w.currentIndex(ctx, env, rng)
			if rerr != nil {
				start, reload = s.End, false
				continue
			}
			start, reload = idx, true
		default:
			start, reload = s.End, false
		}
		if err != nil && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// errLifeOver ends a session on purpose.
var errLifeOver = errors.New("planned resume")

// stream runs one session. It returns a non-zero index when the server
// said the start index was compacted.
func (w *Watch) stream(ctx context.Context, env *Env, node *cluster.Node, s *history.WatchSession, life time.Duration) (uint64, error) {
	sctx, cancel := context.WithTimeout(ctx, life)
	defer cancel()
	st, err := lodestonepb.NewWatchClient(node.Conn).Watch(sctx)
	if err != nil {
		return 0, w.streamErr(sctx, err)
	}
	var sendMu sync.Mutex
	send := func(req *lodestonepb.WatchRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(req)
	}
	if err := send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: &lodestonepb.WatchCreate{
		WatchId: 1, Key: []byte(check.Prefix), Prefix: true, StartIndex: s.Start,
	}}}); err != nil {
		return 0, w.streamErr(sctx, err)
	}
	// The progress ticker is owned by this session and ends with it.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Progress{Progress: &lodestonepb.WatchProgress{}}}) != nil {
					return
				}
			}
		}
	}()
	defer wg.Wait()
	defer cancel()
	for i := 0; i < 10_000_000; i++ {
		resp, err := st.Recv()
		if err != nil {
			return 0, w.streamErr(sctx, err)
		}
		if resp.WatchId != 1 {
			continue
		}
		if resp.Canceled {
			switch {
			case resp.CompactedIndex > 0:
				return resp.CompactedIndex, fmt.Errorf("compacted at %d: %s", resp.CompactedIndex, resp.CancelReason)
			case resp.ResyncIndex > 0:
				// Every event up to ResyncIndex was delivered.
				s.End = max(s.End, resp.ResyncIndex)
				w.setEnd(s.Watcher, s.End)
				return 0, fmt.Errorf("resync from %d: %s", resp.ResyncIndex, resp.CancelReason)
			}
			return 0, fmt.Errorf("canceled: %s", resp.CancelReason)
		}
		now := env.H.Now()
		for _, ev := range resp.Events {
			kv := ev.GetKv()
			env.H.RecordEvent(history.WatchEvent{
				Watcher: s.Watcher, Session: s.Session, Node: s.Node, T: now,
				Key: string(kv.GetKey()), Index: kv.GetModifyIndex(), Value: string(kv.GetValue()),
				Delete: ev.Type == lodestonepb.Event_DELETE,
			})
			s.End = max(s.End, kv.GetModifyIndex())
		}
		// NB: a Created answer's index is not used: whether it promises
		// the replay that follows is the server's detail, and trusting it
		// could only make the checker report false gaps.
		if !resp.Created {
			s.End = max(s.End, resp.Index)
		}
		w.setEnd(s.Watcher, s.End)
	}
	return 0, errors.New("session response bound reached")
}

func (w *Watch) streamErr(sctx context.Context, err error) error {
	if status.Code(err) == codes.Unimplemented {
		w.disabled.Store(true)
		return fmt.Errorf("server does not serve Watch: %w", err)
	}
	if errors.Is(err, io.EOF) {
		return errors.New("stream closed by server")
	}
	if sctx.Err() != nil {
		return errLifeOver
	}
	return err
}

// Final has nothing to read: the final range read is the reference.
func (w *Watch) Final(context.Context, *Env) error { return nil }
