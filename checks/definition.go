package checks

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Definition is Consul's AgentServiceCheck as clients send it to
// /v1/agent/service/register and /v1/agent/check/register, and as the
// agent's config file holds it. encoding/json matches the field names
// case-insensitively, as Consul's decoder does.
type Definition struct {
	CheckID    string
	Name       string
	ScriptArgs []string
	// Args is ScriptArgs as Consul's config files spell it ("args").
	Args                           []string
	DockerContainerID              string
	Shell                          string
	Interval                       Duration
	Timeout                        Duration
	TTL                            Duration
	HTTP                           string
	Header                         map[string][]string
	Method                         string
	Body                           string
	TCP                            string
	UDP                            string
	Status                         string
	Notes                          string
	TLSServerName                  string
	TLSSkipVerify                  bool
	GRPC                           string
	GRPCUseTLS                     bool
	H2PING                         string
	H2PingUseTLS                   bool
	AliasNode                      string
	AliasService                   string
	SuccessBeforePassing           int
	FailuresBeforeWarning          int
	FailuresBeforeCritical         int
	DeregisterCriticalServiceAfter Duration
}

// DefinitionError is a definition Lodestone refuses, worded as Consul
// words it; the HTTP API answers it with 400.
type DefinitionError struct{ Msg string }

func (e *DefinitionError) Error() string { return e.Msg }

func invalid(format string, args ...any) error {
	return &DefinitionError{Msg: fmt.Sprintf(format, args...)}
}

// script returns the script's arguments, whichever way they were spelled.
func (d *Definition) script() []string {
	if len(d.ScriptArgs) > 0 {
		return d.ScriptArgs
	}
	return d.Args
}

// Type names the kind of check as Consul reports it in HealthCheck.Type.
func (d *Definition) Type() string {
	switch {
	case d.TTL != 0:
		return KindTTL
	case d.HTTP != "":
		return KindHTTP
	case d.TCP != "":
		return KindTCP
	case d.UDP != "":
		return "udp"
	case d.GRPC != "":
		return KindGRPC
	case d.H2PING != "":
		return "h2ping"
	case d.DockerContainerID != "":
		return "docker"
	case d.AliasNode != "" || d.AliasService != "":
		return "alias"
	case len(d.script()) > 0:
		return KindScript
	}
	return ""
}

// Catalog returns the catalog record the definition registers on node:
// a check of service svc, or with svc nil a node-level check. i and n
// number it among the service's checks for Consul's default ids
// ("service:<id>", "service:<id>:<i+1>" when there are several). Its
// status is the definition's, or unspecified (the store then starts it
// critical, as Consul does).
func (d *Definition) Catalog(node string, svc *lodestonepb.Service, i, n int) (*lodestonepb.Check, error) {
	st, err := lodestonepb.ParseHealthStatus(d.Status)
	if err != nil {
		return nil, invalid("Status for checks must 'passing', 'warning', 'critical'")
	}
	id, name := d.CheckID, d.Name
	var sid string
	if svc != nil {
		sid = svc.Id
		if sid == "" {
			sid = svc.Name
		}
		if id == "" {
			id = "service:" + sid
			if n > 1 {
				id = fmt.Sprintf("service:%s:%d", sid, i+1)
			}
		}
		if name == "" {
			name = fmt.Sprintf("Service '%s' check", svc.Name)
		}
	}
	if id == "" {
		id = name
	}
	if id == "" {
		return nil, invalid("Missing check name")
	}
	def := &lodestonepb.CheckDefinition{Http: d.HTTP, Method: d.Method, Body: d.Body, TlsServerName: d.TLSServerName,
		TlsSkipVerify: d.TLSSkipVerify, Tcp: d.TCP, Udp: d.UDP, Grpc: d.GRPC, GrpcUseTls: d.GRPCUseTLS, H2Ping: d.H2PING,
		H2PingUseTls: d.H2PingUseTLS, Args: d.script(), Shell: d.Shell, DockerContainerId: d.DockerContainerID,
		AliasNode: d.AliasNode, AliasService: d.AliasService, Interval: d.Interval.PB(), Timeout: d.Timeout.PB(),
		Ttl: d.TTL.PB(), DeregisterCriticalServiceAfter: d.DeregisterCriticalServiceAfter.PB(),
		SuccessBeforePassing: int32(d.SuccessBeforePassing), FailuresBeforeWarning: int32(d.FailuresBeforeWarning),
		FailuresBeforeCritical: int32(d.FailuresBeforeCritical), Header: headerPB(d.Header)}
	return &lodestonepb.Check{Node: node, CheckId: id, Name: name, Status: st, Notes: d.Notes, ServiceId: sid,
		Type: d.Type(), Definition: def}, nil
}

func headerPB(h map[string][]string) map[string]*lodestonepb.HeaderValues {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string]*lodestonepb.HeaderValues, len(h))
	for k, v := range h {
		out[k] = &lodestonepb.HeaderValues{Values: v}
	}
	return out
}

// Duration reads a Go duration string ("10s") or a number of nanoseconds,
// and writes a duration string, like Consul's api.ReadableDuration.
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		if s == "" {
			*d = 0
			return nil
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("invalid duration %q: use a Go duration such as 10s", s)
		}
		*d = Duration(v)
		return nil
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("invalid duration %s: use a string such as \"10s\" or integer nanoseconds", b)
	}
	*d = Duration(n)
	return nil
}

// PB is d as a protobuf duration; nil for zero (unset).
func (d Duration) PB() *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(time.Duration(d))
}
