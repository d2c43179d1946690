package checks

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// record builds the catalog record of d as a check of service "web".
func record(t *testing.T, d Definition) *lodestonepb.Check {
	t.Helper()
	rec, err := d.Catalog("n1", &lodestonepb.Service{Id: "web1", Name: "web"}, 0, 1)
	if err != nil {
		t.Fatalf("catalog record of %+v: %v", d, err)
	}
	return rec
}

func TestCompileKindsAndConsulsRefusals(t *testing.T) {
	sec := Duration(time.Second)
	cases := []struct {
		name     string
		def      Definition
		opts     Options
		wantKind string
		wantErr  string
	}{
		{"http", Definition{HTTP: "http://x/health", Interval: sec}, DefaultOptions(), KindHTTP, ""},
		{"tcp", Definition{TCP: "127.0.0.1:1", Interval: sec}, DefaultOptions(), KindTCP, ""},
		{"grpc", Definition{GRPC: "127.0.0.1:1/svc", Interval: sec}, DefaultOptions(), KindGRPC, ""},
		{"ttl", Definition{TTL: sec}, DefaultOptions(), KindTTL, ""},
		{"script allowed", Definition{ScriptArgs: []string{"true"}, Interval: sec}, Options{EnableScriptChecks: true}, KindScript, ""},
		{"script as args", Definition{Args: []string{"true"}, Interval: sec}, Options{EnableScriptChecks: true}, KindScript, ""},
		{"script from the API refused", Definition{ScriptArgs: []string{"true"}, Interval: sec}, Options{EnableLocalScriptChecks: true},
			"", "Scripts are disabled on this agent from remote calls"},
		{"local script allowed locally", Definition{Args: []string{"true"}, Interval: sec}, Options{EnableLocalScriptChecks: true, Local: true}, KindScript, ""},
		{"local script refused", Definition{Args: []string{"true"}, Interval: sec}, Options{Local: true}, "", "Scripts are disabled on this agent;"},
		{"nothing to run", Definition{Name: "x"}, DefaultOptions(), "", "Invalid check: TTL must be > 0 for TTL checks"},
		{"http without interval", Definition{HTTP: "http://x"}, DefaultOptions(), "", "Invalid check: Interval must be > 0"},
		{"interval and ttl", Definition{TTL: sec, Interval: sec}, DefaultOptions(), "", "Invalid check: Interval and TTL cannot both be specified"},
		{"two probes", Definition{HTTP: "http://x", TCP: "x:1", Interval: sec}, DefaultOptions(), "", "Invalid check: give one of"},
		{"udp unsupported", Definition{UDP: "x:1", Interval: sec}, DefaultOptions(), "", "not supported"},
		{"alias unsupported", Definition{AliasService: "db"}, DefaultOptions(), "", "not supported"},
		{"negative ttl", Definition{TTL: -sec}, DefaultOptions(), "", "must not be negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Compile(record(t, tc.def), tc.opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				if strings.HasPrefix(tc.wantErr, "Scripts") != errors.Is(err, ErrScriptsDisabled) {
					t.Fatalf("errors.Is(%v, ErrScriptsDisabled) wrong", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Kind != tc.wantKind {
				t.Fatalf("kind %q, want %q", s.Kind, tc.wantKind)
			}
		})
	}
}

func TestCompileDefaultsAndMinimums(t *testing.T) {
	opts := Options{MinInterval: time.Second, MinDeregisterAfter: time.Minute}
	s, err := Compile(record(t, Definition{HTTP: "http://x", Interval: Duration(100 * time.Millisecond),
		DeregisterCriticalServiceAfter: Duration(time.Second)}), opts)
	if err != nil {
		t.Fatal(err)
	}
	if s.Interval != time.Second || s.DeregisterAfter != time.Minute {
		t.Fatalf("interval %v deregister %v, want raised to 1s and 1m", s.Interval, s.DeregisterAfter)
	}
	if s.Timeout != DefaultTimeout || s.Method != "GET" || s.Initial != critical {
		t.Fatalf("timeout %v method %q initial %v, want Consul's defaults", s.Timeout, s.Method, s.Initial)
	}
	if s.ID() != "service:web1" || s.ServiceID() != "web1" || s.Name() != "Service 'web' check" {
		t.Fatalf("id %q service %q name %q", s.ID(), s.ServiceID(), s.Name())
	}
	script, err := Compile(record(t, Definition{Args: []string{"true"}, Interval: Duration(time.Second)}), Options{EnableScriptChecks: true})
	if err != nil || script.Timeout != DefaultScriptTimeout {
		t.Fatalf("script timeout %v (%v), want %v", script.Timeout, err, DefaultScriptTimeout)
	}
	// A node-level check has no service to deregister.
	node, err := (&Definition{Name: "disk", TTL: Duration(time.Second), DeregisterCriticalServiceAfter: Duration(time.Hour), Status: "passing"}).Catalog("n1", nil, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := Compile(node, opts)
	if err != nil || ns.DeregisterAfter != 0 || ns.Initial != passing || ns.ID() != "disk" {
		t.Fatalf("node check: %+v %v", ns, err)
	}
}

func TestCatalogRecordIDs(t *testing.T) {
	svc := &lodestonepb.Service{Id: "db/pg1", Name: "db"}
	two := []Definition{{TTL: Duration(time.Second)}, {TTL: Duration(time.Second), CheckID: "own"}}
	var ids []string
	for i, d := range two {
		rec, err := d.Catalog("n1", svc, i, len(two))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rec.CheckId)
		if rec.ServiceId != "db/pg1" || rec.Type != KindTTL || rec.Node != "n1" {
			t.Fatalf("record %+v", rec)
		}
	}
	if got := strings.Join(ids, ","); got != "service:db/pg1:1,own" {
		t.Fatalf("ids %q", got)
	}
	if _, err := (&Definition{TTL: Duration(time.Second)}).Catalog("n1", nil, 0, 1); err == nil || err.Error() != "Missing check name" {
		t.Fatalf("node check without a name: %v", err)
	}
	if _, err := (&Definition{Name: "x", Status: "fine"}).Catalog("n1", nil, 0, 1); err == nil || !strings.Contains(err.Error(), "Status for checks must") {
		t.Fatalf("bad status: %v", err)
	}
}
