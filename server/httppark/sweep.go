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
		for _, p := range l.parkedNow() {
			if peerclosed.Closed(p.conn) && l.unpark(p) {
				l.gone.Add(1)
				p.conn.Close()
			}
		}
		l.sweeps.Add(1)
	}
}
