package peer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// probeListen is how long Probe waits for a peer to refuse its stream
// after the preamble; a peer that keeps it open that long has accepted
// it.
const probeListen = 300 * time.Millisecond

// Probe checks that addr answers as a member of this cluster would: it
// dials a Raft stream there (over TLS when the transport uses TLS), sends
// the preamble with this member's cluster id, and waits briefly for a
// refusal. A member of this cluster, or a member that joins it and has
// not learned its id yet, keeps the stream open and passes; a closed
// port, a failed handshake, another cluster's member or a stream ended at
// once is an error saying which. It sends no Raft message.
func (t *Transport) Probe(ctx context.Context, addr string) error {
	conn, err := dialRaftStream(ctx, addr, t.Cluster(), t.tls)
	if err != nil {
		return err
	}
	defer conn.Close()
	wait := probeListen
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl))
	}
	if err := conn.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	err = readRejection(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil // NB: nothing to say within the wait: accepted
	}
	return fmt.Errorf("probe %s: %w", addr, err)
}
