package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// LockOptions configures Client.Lock.
type LockOptions struct {
	// Key is the KV key that carries the lock (required).
	Key string
	// Value is written to Key when the lock is taken.
	Value []byte
	// Node is the catalog node the lock's session belongs to (required;
	// it must be registered: see Client.Register).
	Node string
	// SessionName labels the session (shown by session list).
	SessionName string
	// TTL is the session's TTL; the holder renews every TTL/2. Zero means
	// 15s. The server frees the lock about 2×TTL after the last renewal if
	// the holder dies.
	TTL time.Duration
	// LockDelay keeps others from taking the key this long after the
	// session is lost (not after a clean Unlock). Zero means the server's
	// default (15s); a negative value means none.
	LockDelay time.Duration
	// Wait caps one blocking read while the lock is held by someone else.
	// Zero means 1m.
	Wait time.Duration
	// RetryWait is the pause before trying again when the key is free but
	// could not be taken (a lock delay in force). Zero means 1s.
	RetryWait time.Duration
}

// Held is a lock this client holds. Lost is closed if the lock is lost:
// the server refused a renewal (the session expired or was invalidated,
// which also released the key) or renewals failed for a whole TTL. Unlock
// releases it. The renewal goroutine is owned by Held and ends in Unlock.
type Held struct {
	c       *Client
	o       LockOptions
	Session string

	lost     chan struct{}
	lostOnce sync.Once
	stop     context.CancelFunc
	done     chan struct{}
}

// ErrLockLost is the cause of a lost lock: Held.Err after Lost is closed.
var ErrLockLost = errors.New("client: lock lost")

// Lock blocks until it holds o.Key (or ctx ends): it creates a session on
// o.Node, acquires the key, and while the key is held by another session
// blocks on it until it changes. The returned Held renews the session
// until Unlock.
func (c *Client) Lock(ctx context.Context, o LockOptions) (*Held, error) {
	if o.Key == "" || o.Node == "" {
		return nil, fmt.Errorf("lock: Key and Node are required")
	}
	if o.TTL == 0 {
		o.TTL = 15 * time.Second
	}
	if o.Wait == 0 {
		o.Wait = time.Minute
	}
	if o.RetryWait == 0 {
		o.RetryWait = time.Second
	}
	se := &lodestonepb.SessionEntry{Name: o.SessionName, Node: o.Node, Ttl: durationpb.New(o.TTL)}
	switch {
	case o.LockDelay > 0:
		se.LockDelay = durationpb.New(o.LockDelay)
	case o.LockDelay < 0:
		se.LockDelay = durationpb.New(0)
	}
	se, err := c.CreateSession(ctx, se)
	if err != nil {
		return nil, fmt.Errorf("create lock session: %w", err)
	}
	h := &Held{c: c, o: o, Session: se.GetId(), lost: make(chan struct{}), done: make(chan struct{})}
	rctx, stop := context.WithCancel(context.Background())
	h.stop = stop
	go h.renew(rctx)
	if err := h.acquire(ctx); err != nil {
		h.Unlock(context.WithoutCancel(ctx))
		return nil, err
	}
	return h, nil
}

func (h *Held) acquire(ctx context.Context) error {
	for {
		ok, resp, err := h.c.Acquire(ctx, h.o.Key, h.o.Value, h.Session)
		if err != nil {
			return fmt.Errorf("acquire %q: %w", h.o.Key, err)
		}
		if ok {
			return nil
		}
		select {
		case <-h.lost:
			return fmt.Errorf("acquire %q: %w", h.o.Key, ErrLockLost)
		default:
		}
		if kv := resp.GetKv(); kv.GetSession() != "" {
			// Held by another session: sleep until the key changes.
			if _, err := h.c.Get(ctx, h.o.Key, WaitIndex(kv.GetModifyIndex(), h.o.Wait)); err != nil {
				return fmt.Errorf("wait for %q: %w", h.o.Key, err)
			}
			continue
		}
		// Free but refused: a lock delay is in force.
		t := time.NewTimer(h.o.RetryWait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// renew renews the session every TTL/2 until ctx ends; a renewal the
// server refuses (the session is gone) or that keeps failing for a whole
// TTL loses the lock.
func (h *Held) renew(ctx context.Context) {
	defer close(h.done)
	every := h.o.TTL / 2
	last := time.Now()
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := h.c.RenewSession(ctx, h.Session)
		switch {
		case err == nil:
			last = time.Now()
			t.Reset(every)
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrCASFailed) || time.Since(last) > h.o.TTL:
			h.c.log.Warn("lock lost", "key", h.o.Key, "session", h.Session, "err", err)
			h.lostOnce.Do(func() { close(h.lost) })
			return
		default:
			t.Reset(time.Second)
		}
	}
}

// Lost is closed when the lock is lost.
func (h *Held) Lost() <-chan struct{} { return h.lost }

// Unlock releases the key and destroys the session; it stops the renewal
// first. It returns the first error.
func (h *Held) Unlock(ctx context.Context) error {
	h.stop()
	<-h.done
	var errs []error
	if _, err := h.c.Release(ctx, h.o.Key, h.o.Value, h.Session); err != nil && !errors.Is(err, ErrCASFailed) {
		errs = append(errs, fmt.Errorf("release %q: %w", h.o.Key, err))
	}
	if _, err := h.c.DestroySession(ctx, h.Session); err != nil {
		errs = append(errs, fmt.Errorf("destroy session %s: %w", h.Session, err))
	}
	return errors.Join(errs...)
}
