package httppark

import (
	"net"
	"time"

	"github.com/lodestone-kv/lodestone/internal/handback"
)

// Wrap returns inner with the connections the Lot hands back added to
// what Accept returns; serve the http.Server on it. A Lot has one
// listener: Park refuses requests until Wrap was called. Closing the
// returned listener closes inner.
func (l *Lot) Wrap(inner net.Listener) net.Listener {
	ln := handback.Wrap(inner)
	l.mu.Lock()
	l.listener = ln
	l.mu.Unlock()
	return ln
}

// handBack gives c, with what its client already sent, to the server's
// Accept; false if the listener is closed (the caller closes c).
func (l *Lot) handBack(c net.Conn, leftover []byte) bool {
	l.mu.Lock()
	ln := l.listener
	l.mu.Unlock()
	if ln == nil {
		return false
	}
	// NB: the Lot's answers leave their write deadline set (answer); the
	// http.Server sets none of its own and would inherit it.
	if err := c.SetWriteDeadline(time.Time{}); err != nil {
		return false
	}
	return ln.Hand(c, leftover, l.stop)
}
