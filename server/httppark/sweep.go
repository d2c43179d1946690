package httppark

import (
	"time"

	"github.com/lodestone-kv/lodestone/internal/peerclosed"
)

// sweepLoop frees the parked requests whose clients went away. net/http
// learns that from the connection's background read; a parked connection
// has no reader, so every SweepInterval each one is peeked at instead: a
// closed or reset connection is let go, one with data waiting (a
// pipelined request) is left for net/http to read once handed back.
func (l *Lot) sweepLoop() {
	defer l.wg.Done()
	t := time.NewTicker(l.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		l.sweep()
	}
}

// sweepChunk is how many connections a sweep peeks at between yields. A
// peek is a system call of about 2 µs; 10,000 parked connections peeked
// in one go held a leader's only processor for about 20 ms, a stall
// every writer saw. Yielding every 64 bounds that to well under a
// millisecond and costs nothing when nothing else is runnable.
const sweepChunk = 64

// sweep peeks at every parked connection once and lets go of those whose
// clients are gone.
func (l *Lot) sweep() {
	for i, p := range l.parkedNow() {
		if i > 0 && i%sweepChunk == 0 {
			l.yield()
			select {
			case <-l.stop:
				return
			default:
			}
		}
		if peerclosed.Closed(p.conn) && l.unpark(p) {
			l.gone.Add(1)
			p.conn.Close()
		}
	}
	l.sweeps.Add(1)
}
