package gateway

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"

	"github.com/lodestone-kv/lodestone/gateway/internal/h1"
)

// proxyUpgrade passes a protocol upgrade through: the handshake goes to
// one origin like any request (never retried), and after its 101 the
// client's and the origin's connections are spliced (h1.Tunnel) until
// either side closes or both stay silent for IdleTimeout. The upgraded
// connection keeps its origin's concurrency slot but gives back its
// admission slot: it is no longer a request in flight.
//
// NB: upgrades always use HTTP/1.1 to the origin; the transport does so by
// itself for requests that carry Upgrade, even on an ALPN pool.
func (g *Gateway) proxyUpgrade(w http.ResponseWriter, r *http.Request, svc *service, re *routeEntry, shard int, slot *admission) (int, bool) {
	p := svc.choose(shard, g.clock.Now().UnixNano(), nil, rand.IntN)
	if p == nil {
		g.shed(w, shedSaturated)
		return http.StatusServiceUnavailable, false
	}
	hdr := outboundHeader(r)
	hdr["Connection"] = []string{"Upgrade"}
	hdr["Upgrade"] = r.Header["Upgrade"]
	a := g.startAttempt(r, re, p, hdr)
	var resp *http.Response
	tr, err := p.transport(a.ctx)
	if err == nil {
		resp, err = tr.RoundTrip(a.out)
	}
	a.timer.headers()
	if err != nil {
		g.finishAttempt(svc, a, 0, r.Context().Err() == nil)
		status := http.StatusBadGateway
		if errors.Is(err, ErrResponseHeaderTimeout) {
			status = http.StatusGatewayTimeout
		}
		http.Error(w, http.StatusText(status), status)
		return status, false
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		originFault, abort := g.writeResponse(w, resp, a)
		g.finishAttempt(svc, a, resp.StatusCode, resp.StatusCode >= 500 || originFault)
		return resp.StatusCode, abort
	}
	back, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		g.finishAttempt(svc, a, 0, true)
		http.Error(w, "origin upgrade without a connection", http.StatusBadGateway)
		return http.StatusBadGateway, false
	}
	tun, err := h1.Hijack(w, back)
	if err != nil {
		back.Close()
		g.finishAttempt(svc, a, 0, false)
		http.Error(w, "cannot upgrade this connection", http.StatusInternalServerError)
		return http.StatusInternalServerError, false
	}
	if err := tun.Switch(resp); err != nil {
		tun.Close()
		g.finishAttempt(svc, a, http.StatusSwitchingProtocols, false)
		return http.StatusSwitchingProtocols, false
	}
	slot.release()

	// The idle timer (or the client's ctx) ends the splice, and so does
	// Close: http.Server.Shutdown neither closes nor waits for hijacked
	// connections, so the gateway tracks them itself.
	stop := context.AfterFunc(a.ctx, tun.Close)
	defer stop()
	if !g.trackUpgrade() {
		tun.Close()
		g.finishAttempt(svc, a, http.StatusSwitchingProtocols, false)
		return http.StatusSwitchingProtocols, false
	}
	defer g.upgrades.Done()
	stopG := context.AfterFunc(g.ctx, tun.Close)
	defer stopG()
	err = tun.Splice(a.timer.active)
	originFault := err != nil && !errors.Is(err, io.EOF) && context.Cause(a.ctx) == ErrIdleTimeout
	g.finishAttempt(svc, a, http.StatusSwitchingProtocols, originFault)
	return http.StatusSwitchingProtocols, false
}

// trackUpgrade counts a splice for Close to wait for; false once the
// gateway is closing.
func (g *Gateway) trackUpgrade() bool {
	g.upMu.Lock()
	defer g.upMu.Unlock()
	if g.ctx.Err() != nil {
		return false
	}
	g.upgrades.Add(1)
	return true
}
