package httppark

import (
	"time"

	"github.com/lodestone-kv/lodestone/internal/peerclosed"
)

// sweepLoop frees the parked requests whose clients went away. net/http
// learns that from the connection's background read; a parked connection
// has no reader, so each one is peeked at instead: a closed or reset
// connection is let go, one with data waiting (a pipelined request) is
// left for net/http to read once handed back.
//
// A round peeks at every parked connection once, sweepChunk at a time,
// with the chunks spread evenly over SweepInterval. Peeking at all of
// them at once, even yielding between chunks, was about 20 ms of a
// leader's processor every 5 s with 10,000 queries parked, and the writes
// in flight then were its slowest; spread out, it is 64 peeks (~0.1 ms)
// every 32 ms.
func (l *Lot) sweepLoop() {
	defer l.wg.Done()
	chunk := make([]*parked, 0, sweepChunk)
	for l.pause(l.sweepGap()) {
		chunk = l.nextSweepChunk(chunk[:0])
		for i, p := range chunk {
			if peerclosed.Closed(p.conn) && l.unpark(p) {
				l.gone.Add(1)
				p.conn.Close()
			}
			chunk[i] = nil // NB: an answered request is not kept until the next chunk
		}
	}
}

// sweepChunk is how many connections a sweep peeks at in one go. A peek is
// a system call of about 2 µs.
const sweepChunk = 64

// sweepGap is the pause before the next chunk: SweepInterval over the
// chunks a round of what is parked now takes (the whole interval when
// nothing is parked).
func (l *Lot) sweepGap() time.Duration {
	l.mu.Lock()
	n := len(l.order)
	l.mu.Unlock()
	chunks := (n + sweepChunk - 1) / sweepChunk
	return l.cfg.SweepInterval / time.Duration(max(chunks, 1))
}

// nextSweepChunk appends the next chunk of the current round to buf. The
// chunk that reaches the end of order ends the round. A request removed
// behind the cursor moves the last one into its slot (see unpark), where
// this round no longer looks: that one waits for the next round, which is
// why a hung-up client may take two intervals to be let go.
func (l *Lot) nextSweepChunk(buf []*parked) []*parked {
	l.mu.Lock()
	defer l.mu.Unlock()
	start := min(l.cursor, len(l.order))
	end := min(start+sweepChunk, len(l.order))
	buf = append(buf, l.order[start:end]...)
	l.cursor = end
	if end == len(l.order) {
		l.cursor = 0
		l.sweeps.Add(1)
	}
	return buf
}

// sleep waits d, or until the Lot closes (false).
func (l *Lot) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.stop:
		return false
	case <-t.C:
		return true
	}
}
