package agent

import (
	"fmt"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
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

// CheckDefinition is Consul's AgentServiceCheck: an HTTP, TCP, gRPC, TTL
// or script check (package checks).
type CheckDefinition = checks.Definition

// Duration reads Consul's "10s" strings (or nanoseconds as a number).
type Duration = checks.Duration

// compiled is a service definition turned into its catalog record and
// check specs.
type compiled struct {
	service *lodestonepb.Service
	checks  []*checks.Spec
}

// compile checks the definition and turns it into what runs; opts say
// which checks the agent runs (scripts) and with what minimums.
func (s *ServiceDefinition) compile(opts checks.Options) (*compiled, error) {
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
		if d == nil {
			return nil, fmt.Errorf("%w: service %q: check %d is null", ErrBadDefinition, id, i+1)
		}
		rec, err := d.Catalog("", out.service, i, len(defs))
		if err != nil {
			return nil, fmt.Errorf("%w: service %q: %v", ErrBadDefinition, id, err)
		}
		if seen[rec.CheckId] {
			return nil, fmt.Errorf("%w: service %q has two checks %q", ErrBadDefinition, id, rec.CheckId)
		}
		seen[rec.CheckId] = true
		spec, err := checks.Compile(rec, opts)
		if err != nil {
			return nil, fmt.Errorf("%w: service %q: %w", ErrBadDefinition, id, err)
		}
		out.checks = append(out.checks, spec)
	}
	return out, nil
}
