package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/client"
)

// fleet is the drill's clients and watchers, run in the population
// process (see child.go): clients that each read (and every tenth time
// write) once per interval, and watchers on the first of them following
// the key the ticker writes.
type fleet struct {
	clients  []*client.Client
	lastOK   []atomic.Int64 // unix nanos of each client's last success
	watchIdx []atomic.Int64 // index of each watcher's last batch
	wg       sync.WaitGroup
	cancel   context.CancelFunc
}

func startFleet(ctx context.Context, eps []string, o options) (*fleet, error) {
	ctx, cancel := context.WithCancel(ctx)
	p := &fleet{cancel: cancel, lastOK: make([]atomic.Int64, o.clients), watchIdx: make([]atomic.Int64, o.watchers)}
	quiet := slog.New(slog.DiscardHandler)
	for range o.clients {
		// Each client lists the servers in its own order, as a fleet's
		// config would: the load is spread, and each fails over.
		order := append([]string(nil), eps...)
		rand.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		c, err := client.New(client.Config{Endpoints: order, RequestTimeout: 3 * time.Second, BackoffBase: 100 * time.Millisecond, BackoffMax: 2 * time.Second, Logger: quiet})
		if err != nil {
			p.stop()
			return nil, err
		}
		p.clients = append(p.clients, c)
	}
	for i, c := range p.clients {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.clientLoop(ctx, i, c, o)
		}()
		if i < o.watchers {
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.watchLoop(ctx, i, c)
			}()
		}
	}
	return p, nil
}

func (p *fleet) clientLoop(ctx context.Context, i int, c *client.Client, o options) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Duration(rand.Int64N(int64(o.interval)))):
	}
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for n := 0; ; n++ {
		var err error
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		// A tenth of the clients write in each round, from the first round
		// on, so every window holds writes at the same rate (all writing
		// in the same tenth round left windows with the ticker's alone).
		if (n+i)%10 == 9 {
			_, err = c.Put(rctx, fmt.Sprintf("drill/client/%d", i), []byte(strconv.Itoa(n)))
		} else {
			_, err = c.Get(rctx, fmt.Sprintf("drill/key/%d", rand.IntN(max(o.keys, 1))))
		}
		cancel()
		if err == nil {
			p.lastOK[i].Store(time.Now().UnixNano())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *fleet) watchLoop(ctx context.Context, i int, c *client.Client) {
	w := c.Watch(ctx, "drill/tick/", client.WatchPrefix(), client.WithProgressNotify())
	defer w.Close()
	for {
		b, err := w.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// The watch ended (compacted or given up): start again.
			w.Close()
			w = c.Watch(ctx, "drill/tick/", client.WatchPrefix(), client.WithProgressNotify())
			continue
		}
		p.watchIdx[i].Store(int64(b.Index))
	}
}

func (p *fleet) stop() {
	p.cancel()
	p.wg.Wait()
	for _, c := range p.clients {
		c.Close()
	}
}

// served counts clients with a success after t and watchers past index.
func (p *fleet) served(t time.Time, index uint64) (clients, watchers int) {
	for i := range p.lastOK {
		if p.lastOK[i].Load() > t.UnixNano() {
			clients++
		}
	}
	for i := range p.watchIdx {
		if uint64(p.watchIdx[i].Load()) >= index {
			watchers++
		}
	}
	return clients, watchers
}
