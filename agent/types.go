package agent

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// ServiceDefinition is Consul's AgentServiceRegistration as the official
// client sends it to /v1/agent/service/register (fields we do not use are
// ignored).
type ServiceDefinition struct {
	ID      string             `json:"ID"`
	Name    string             `json:"Name"`
	Tags    []string           `json:"Tags"`
	Address string             `json:"Address"`
	Port    int                `json:"Port"`
	Meta    map[string]string  `json:"Meta"`
	Check   *CheckDefinition   `json:"Check"`
	Checks  []*CheckDefinition `json:"Checks"`
}

// CheckDefinition is Consul's AgentServiceCheck: one of HTTP, TCP or TTL.
type CheckDefinition struct {
	CheckID       string              `json:"CheckID"`
	Name          string              `json:"Name"`
	Notes         string              `json:"Notes"`
	Status        string              `json:"Status"`
	Interval      Duration            `json:"Interval"`
	Timeout       Duration            `json:"Timeout"`
	TTL           Duration            `json:"TTL"`
	HTTP          string              `json:"HTTP"`
	Method        string              `json:"Method"`
	Header        map[string][]string `json:"Header"`
	Body          string              `json:"Body"`
	TLSSkipVerify bool                `json:"TLSSkipVerify"`
	TCP           string              `json:"TCP"`
}

// Duration reads Consul's "10s" strings (or nanoseconds as a number).
type Duration time.Duration

func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if s == "" {
			*d = 0
			return nil
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%w: duration %q: %v", ErrBadDefinition, s, err)
		}
		*d = Duration(v)
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("%w: duration %s", ErrBadDefinition, b)
	}
	*d = Duration(n)
	return nil
}

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Check kinds.
const (
	kindHTTP = "http"
	kindTCP  = "tcp"
	kindTTL  = "ttl"
)

// compiled is a service definition turned into catalog records and check
// specs.
type compiled struct {
	service *lodestonepb.Service
	checks  []*checkSpec
}

// checkSpec is how one check runs, fixed at registration.
type checkSpec struct {
	id, name, notes, serviceID, kind string
	interval, timeout, ttl           time.Duration
	http, method, body, tcp          string
	header                           map[string][]string
	tlsSkipVerify                    bool
	initial                          lodestonepb.HealthStatus
}

func (s *ServiceDefinition) compile() (*compiled, error) {
	if s.Name == "" {
		return nil, fmt.Errorf("%w: service name is required", ErrBadDefinition)
	}
	id := s.ID
	if id == "" {
		id = s.Name
	}
	if s.Port < 0 || s.Port > 65535 {
		return nil, fmt.Errorf("%w: service %q port %d", ErrBadDefinition, id, s.Port)
	}
	out := &compiled{service: &lodestonepb.Service{
		Id: id, Name: s.Name, Tags: s.Tags, Address: s.Address, Port: uint32(s.Port), Meta: s.Meta,
	}}
	defs := s.Checks
	if s.Check != nil {
		defs = append([]*CheckDefinition{s.Check}, defs...)
	}
	seen := map[string]bool{}
	for i, d := range defs {
		cid := d.CheckID
		if cid == "" {
			// As Consul names them.
			cid = "service:" + id
			if len(defs) > 1 {
				cid = fmt.Sprintf("service:%s:%d", id, i+1)
			}
		}
		if seen[cid] {
			return nil, fmt.Errorf("%w: service %q has two checks %q", ErrBadDefinition, id, cid)
		}
		seen[cid] = true
		spec, err := d.compile(cid, id, s.Name)
		if err != nil {
			return nil, err
		}
		out.checks = append(out.checks, spec)
	}
	return out, nil
}

func (d *CheckDefinition) compile(id, serviceID, serviceName string) (*checkSpec, error) {
	c := &checkSpec{
		id: id, name: d.Name, notes: d.Notes, serviceID: serviceID,
		interval: time.Duration(d.Interval), timeout: time.Duration(d.Timeout), ttl: time.Duration(d.TTL),
		http: d.HTTP, method: d.Method, body: d.Body, tcp: d.TCP, header: d.Header, tlsSkipVerify: d.TLSSkipVerify,
	}
	if c.name == "" {
		c.name = fmt.Sprintf("Service '%s' check", serviceName)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: check %q: %s", ErrBadDefinition, id, fmt.Sprintf(format, args...))
	}
	switch {
	case c.ttl > 0:
		c.kind = kindTTL
	case c.http != "":
		c.kind = kindHTTP
		if c.method == "" {
			c.method = "GET"
		}
	case c.tcp != "":
		c.kind = kindTCP
	default:
		return nil, bad("needs one of HTTP, TCP or TTL (script, gRPC and other kinds are not supported)")
	}
	if c.kind != kindTTL {
		if c.interval <= 0 {
			return nil, bad("needs a positive Interval")
		}
		if c.timeout <= 0 {
			c.timeout = 10 * time.Second // Consul's default
		}
	}
	st, err := lodestonepb.ParseHealthStatus(d.Status)
	if err != nil {
		return nil, bad("%v", err)
	}
	if st == lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED {
		st = lodestonepb.HealthStatus_HEALTH_CRITICAL // Consul's default
	}
	c.initial = st
	return c, nil
}
