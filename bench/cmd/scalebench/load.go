package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// keyOf is the i-th loaded key: scale/0000000, scale/0000001, ...
func keyOf(i int) []byte { return fmt.Appendf(nil, "scale/%07d", i) }

// valueOf is the value of the i-th key: size bytes of a pseudo-random
// stream seeded by i (splitmix64), so every key's value differs, a read
// can be checked without keeping the values, and neither system can
// compress or share them.
func valueOf(i, size int) []byte {
	v := make([]byte, size)
	x := uint64(i)
	var w [8]byte
	for off := 0; off < size; off += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		binary.LittleEndian.PutUint64(w[:], z)
		copy(v[off:], w[:])
	}
	return v
}

// batches is how many transactions of at most batch puts n keys take.
func batches(n, batch int) int { return (n + batch - 1) / batch }

// load writes keys 0..n-1 with values of size bytes on the leader, in
// transactions of batch puts from writers clients on a connection each,
// and fails unless every transaction commits. It returns how long it took.
func (c *cluster) load(ctx context.Context, n, size, batch, writers int) (time.Duration, error) {
	start := time.Now()
	var next atomic.Int64
	total := batches(n, batch)
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		conn, err := dial(c.clients[c.leader])
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		put := c.sys.ops(conn).putBatch
		wg.Go(func() {
			for b := int(next.Add(1) - 1); b < total && errs[w] == nil && ctx.Err() == nil; b = int(next.Add(1) - 1) {
				var keys, values [][]byte
				for i := b * batch; i < min((b+1)*batch, n); i++ {
					keys = append(keys, keyOf(i))
					values = append(values, valueOf(i, size))
				}
				errs[w] = c.putRetrying(ctx, put, keys, values)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// putRetrying retries a batch a few times: a transaction that timed out
// may have committed, and writing it again is harmless (same values).
func (c *cluster) putRetrying(ctx context.Context, put func(context.Context, [][]byte, [][]byte) error, keys, values [][]byte) error {
	var err error
	for attempt := range 3 {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = put(pctx, keys, values)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if aerr := c.checkAlive(); aerr != nil {
			return aerr
		}
		time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
	}
	return fmt.Errorf("put %s to %s: %w", keys[0], keys[len(keys)-1], err)
}
