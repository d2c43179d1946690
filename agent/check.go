package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// check is one check's local state. Plain methods with the time passed in;
// the agent's mutex serializes them.
type check struct {
	spec   *checkSpec
	status lodestonepb.HealthStatus
	output string
	// probed: an HTTP or TCP check has run at least once, so its status is
	// real (TTL checks start with their initial status).
	probed bool
	// ttlDeadline: a TTL check turns critical when now reaches it.
	ttlDeadline time.Time

	// remote is the status the registry was last told (0: never).
	remote lodestonepb.HealthStatus
}

func newCheck(spec *checkSpec, now time.Time) *check {
	c := &check{spec: spec, status: spec.initial}
	if spec.kind == kindTTL {
		c.ttlDeadline = now.Add(spec.ttl)
	}
	return c
}

// record sets the result of a run and reports whether the status changed.
func (c *check) record(st lodestonepb.HealthStatus, output string) bool {
	c.probed = true
	c.output = output
	if st == c.status {
		return false
	}
	c.status = st
	return true
}

// ttlUpdate records an application's report and re-arms the TTL.
func (c *check) ttlUpdate(st lodestonepb.HealthStatus, output string, now time.Time) bool {
	c.ttlDeadline = now.Add(c.spec.ttl)
	return c.record(st, output)
}

// ttlExpire turns a TTL check critical once now reaches its deadline.
func (c *check) ttlExpire(now time.Time) bool {
	if c.spec.kind != kindTTL || now.Before(c.ttlDeadline) {
		return false
	}
	return c.record(lodestonepb.HealthStatus_HEALTH_CRITICAL, fmt.Sprintf("TTL expired (last output before timeout follows): %s", c.output))
}

// dirty reports whether the registry must be told this check's status.
func (c *check) dirty() bool { return c.status != c.remote }

// record returns the catalog record for the check on node.
func (c *check) catalog(node string) *lodestonepb.Check {
	return &lodestonepb.Check{
		Node: node, CheckId: c.spec.id, Name: c.spec.name, Notes: c.spec.notes, ServiceId: c.spec.serviceID,
		Status: c.status, Output: c.output, Type: c.spec.kind, Definition: c.spec.definition(),
	}
}

func (s *checkSpec) definition() *lodestonepb.CheckDefinition {
	d := &lodestonepb.CheckDefinition{Http: s.http, Method: s.method, Body: s.body, Tcp: s.tcp, TlsSkipVerify: s.tlsSkipVerify}
	if len(s.header) > 0 {
		d.Header = map[string]*lodestonepb.HeaderValues{}
		for k, v := range s.header {
			d.Header[k] = &lodestonepb.HeaderValues{Values: v}
		}
	}
	return d
}

// probe runs one HTTP or TCP check: Consul's rules (HTTP 2xx passing, 429
// warning, anything else critical; TCP connect passing, else critical).
func probe(ctx context.Context, s *checkSpec, client *http.Client) (lodestonepb.HealthStatus, string) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	switch s.kind {
	case kindTCP:
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", s.tcp)
		if err != nil {
			return lodestonepb.HealthStatus_HEALTH_CRITICAL, fmt.Sprintf("TCP connect %s: %v", s.tcp, err)
		}
		conn.Close()
		return lodestonepb.HealthStatus_HEALTH_PASSING, fmt.Sprintf("TCP connect %s: Success", s.tcp)
	case kindHTTP:
		req, err := http.NewRequestWithContext(ctx, s.method, s.http, strings.NewReader(s.body))
		if err != nil {
			return lodestonepb.HealthStatus_HEALTH_CRITICAL, fmt.Sprintf("HTTP %s %s: %v", s.method, s.http, err)
		}
		for k, vs := range s.header {
			for _, v := range vs {
				req.Header.Add(k, v)
			}
		}
		if req.Header.Get("User-Agent") == "" {
			req.Header.Set("User-Agent", "lodestone-agent health check")
		}
		resp, err := client.Do(req)
		if err != nil {
			return lodestonepb.HealthStatus_HEALTH_CRITICAL, fmt.Sprintf("HTTP %s %s: %v", s.method, s.http, err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		out := fmt.Sprintf("HTTP %s %s: %s Output: %s", s.method, s.http, resp.Status, body)
		switch {
		case resp.StatusCode >= 200 && resp.StatusCode < 300:
			return lodestonepb.HealthStatus_HEALTH_PASSING, out
		case resp.StatusCode == http.StatusTooManyRequests:
			return lodestonepb.HealthStatus_HEALTH_WARNING, out
		}
		return lodestonepb.HealthStatus_HEALTH_CRITICAL, out
	}
	panic("agent: probe of a " + s.kind + " check") // TTL checks are never probed
}

// checkHTTPClient returns the client of HTTP checks: no keep-alive (a check
// must see a fresh connection's fate), TLS verification as configured.
func checkHTTPClient(skipVerify bool) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DisableKeepAlives: true,
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: skipVerify},
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
