package checks

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Check kinds, as Consul names them in HealthCheck.Type.
const (
	KindHTTP   = "http"
	KindTCP    = "tcp"
	KindTTL    = "ttl"
	KindGRPC   = "grpc"
	KindScript = "script"
)

// Consul's defaults.
const (
	// DefaultTimeout bounds an HTTP, TCP or gRPC probe without a Timeout.
	DefaultTimeout = 10 * time.Second
	// DefaultScriptTimeout bounds a script without a Timeout.
	DefaultScriptTimeout = 30 * time.Second
	// MaxOutput is how much of a probe's output a check keeps.
	MaxOutput = 4096
)

// Options are what the check's owner allows.
type Options struct {
	// EnableScriptChecks lets any definition run a script (Consul's
	// enable_script_checks). Off, a script check is refused with
	// ScriptsDisabledError.
	EnableScriptChecks bool
	// EnableLocalScriptChecks lets definitions from a local config file
	// run scripts (Consul's enable_local_script_checks).
	EnableLocalScriptChecks bool
	// Local says the definition comes from a local config file, not an
	// API call.
	Local bool
	// MinInterval is the shortest probe interval; shorter ones are
	// raised to it. Consul's is 1s.
	MinInterval time.Duration
	// MinDeregisterAfter is the shortest DeregisterCriticalServiceAfter;
	// shorter ones are raised to it. Consul's is 1m.
	MinDeregisterAfter time.Duration
	// Logger receives the warnings about raised values; nil discards.
	Logger *slog.Logger
}

// DefaultOptions are Consul's: no scripts, 1s intervals at least, 1m
// before a critical service may be deregistered.
func DefaultOptions() Options {
	return Options{MinInterval: time.Second, MinDeregisterAfter: time.Minute}
}

// ScriptsDisabledError refuses a script check on an owner that does not
// run scripts, in Consul's words (the HTTP API answers 500, as Consul).
type ScriptsDisabledError struct{ Local bool }

func (e *ScriptsDisabledError) Error() string {
	if e.Local {
		return "Scripts are disabled on this agent; to enable, configure 'enable_script_checks' or 'enable_local_script_checks' to true (flags --enable-script-checks, --enable-local-script-checks)"
	}
	return "Scripts are disabled on this agent from remote calls; to enable, configure 'enable_script_checks' to true (flag --enable-script-checks)"
}

// ErrScriptsDisabled matches every ScriptsDisabledError with errors.Is.
var ErrScriptsDisabled = errors.New("script checks are disabled")

func (e *ScriptsDisabledError) Is(target error) bool { return target == ErrScriptsDisabled }

// Spec is how one check runs, fixed at registration.
type Spec struct {
	// Record is the catalog record the check was registered with; shared,
	// never modified.
	Record *lodestonepb.Check

	Kind                    string
	Interval, Timeout, TTL  time.Duration
	HTTP, Method, Body, TCP string
	Header                  map[string][]string
	TLSServerName           string
	TLSSkipVerify           bool
	GRPC                    string
	GRPCUseTLS              bool
	Args                    []string
	// DeregisterAfter is DeregisterCriticalServiceAfter, 0 for never (and
	// for node-level checks, which have no service to deregister).
	DeregisterAfter time.Duration
	Initial         lodestonepb.HealthStatus
}

// ID, ServiceID and Name are the record's.
func (s *Spec) ID() string        { return s.Record.CheckId }
func (s *Spec) ServiceID() string { return s.Record.ServiceId }
func (s *Spec) Name() string      { return s.Record.Name }

// Compile turns a catalog check record (with its Definition) into a Spec,
// or refuses it: a *DefinitionError for a definition that cannot run, a
// *ScriptsDisabledError for a script the owner does not allow.
func Compile(rec *lodestonepb.Check, opts Options) (*Spec, error) {
	d := rec.GetDefinition()
	if d == nil {
		d = &lodestonepb.CheckDefinition{}
	}
	s := &Spec{Record: proto.CloneOf(rec), Interval: d.Interval.AsDuration(), Timeout: d.Timeout.AsDuration(), TTL: d.Ttl.AsDuration(),
		HTTP: d.Http, Method: d.Method, Body: d.Body, TCP: d.Tcp, TLSServerName: d.TlsServerName, TLSSkipVerify: d.TlsSkipVerify,
		GRPC: d.Grpc, GRPCUseTLS: d.GrpcUseTls, Args: d.Args, Initial: rec.Status}
	if s.Initial == lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED {
		s.Initial = lodestonepb.HealthStatus_HEALTH_CRITICAL
	}
	if len(d.Header) > 0 {
		s.Header = map[string][]string{}
		for k, v := range d.Header {
			s.Header[k] = v.Values
		}
	}
	if err := s.setKind(d); err != nil {
		return nil, err
	}
	if s.Kind == KindScript && !opts.EnableScriptChecks && !(opts.Local && opts.EnableLocalScriptChecks) {
		return nil, &ScriptsDisabledError{Local: opts.Local}
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if s.Kind != KindTTL {
		if s.Interval < opts.MinInterval {
			logger.Warn("check interval below the minimum; raised to it", "check", rec.CheckId, "interval", s.Interval, "minimum", opts.MinInterval)
			s.Interval = opts.MinInterval
		}
		if s.Timeout <= 0 {
			s.Timeout = DefaultTimeout
			if s.Kind == KindScript {
				s.Timeout = DefaultScriptTimeout
			}
		}
	}
	if s.Kind == KindHTTP && s.Method == "" {
		s.Method = "GET"
	}
	if after := d.DeregisterCriticalServiceAfter.AsDuration(); after > 0 && rec.ServiceId != "" {
		if after < opts.MinDeregisterAfter {
			logger.Warn("check's deregister interval below the minimum; raised to it", "check", rec.CheckId, "deregister_after", after, "minimum", opts.MinDeregisterAfter)
			after = opts.MinDeregisterAfter
		}
		s.DeregisterAfter = after
	}
	return s, nil
}

// setKind picks the kind and checks the timing fields, with Consul's
// "Invalid check" messages.
func (s *Spec) setKind(d *lodestonepb.CheckDefinition) error {
	probes := 0
	for _, set := range []bool{d.Http != "", d.Tcp != "", d.Grpc != "", len(d.Args) > 0} {
		if set {
			probes++
		}
	}
	switch {
	case d.Udp != "", d.H2Ping != "", d.DockerContainerId != "", d.AliasNode != "", d.AliasService != "":
		return invalid("Invalid check: UDP, H2PING, Docker and alias checks are not supported; use HTTP, TCP, GRPC, TTL or ScriptArgs")
	case s.TTL < 0 || s.Interval < 0 || s.Timeout < 0:
		return invalid("Invalid check: Interval, Timeout and TTL must not be negative")
	case s.TTL > 0 && s.Interval > 0:
		return invalid("Invalid check: Interval and TTL cannot both be specified")
	case probes > 1:
		return invalid("Invalid check: give one of HTTP, TCP, GRPC or ScriptArgs")
	case s.TTL > 0 && probes > 0:
		return invalid("Invalid check: TTL cannot be combined with HTTP, TCP, GRPC or ScriptArgs")
	case s.TTL > 0:
		s.Kind = KindTTL
	case probes == 0:
		return invalid("Invalid check: TTL must be > 0 for TTL checks")
	case s.Interval <= 0:
		return invalid("Invalid check: Interval must be > 0 for Script, HTTP, GRPC or TCP checks")
	case d.Http != "":
		s.Kind = KindHTTP
	case d.Tcp != "":
		s.Kind = KindTCP
	case d.Grpc != "":
		s.Kind = KindGRPC
	default:
		s.Kind = KindScript
	}
	return nil
}

// String describes the spec for logs.
func (s *Spec) String() string {
	return fmt.Sprintf("%s check %q", s.Kind, s.ID())
}
