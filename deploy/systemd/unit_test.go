// Package systemd checks the systemd units in this directory: systemd
// itself must accept them (systemd-analyze verify, and its security
// score), and the hardening the README promises must stay in them.
package systemd

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"
)

// installedBinary is where the units expect the binary.
const installedBinary = "/usr/local/bin/lodestone"

// expected is what each unit must say beyond the hardening all share.
var expected = []struct {
	file       string
	typ        string
	subcommand string // ExecStart's first argument
	caps       string // CapabilityBoundingSet
	writable   string // ReadWritePaths; "" for none
	reload     bool   // ExecReload sends SIGHUP
}{
	{"lodestone.service", "notify", "server", "", "/var/lib/lodestone", true},
	{"lodestone-agent.service", "exec", "agent", "", "", false},
	{"lodestone-gateway.service", "notify", "gateway", "CAP_NET_BIND_SERVICE", "/var/lib/lodestone-gateway", true},
}

// hardening is every unit's: each key's last value (systemd's rule for
// single-valued keys).
var hardening = map[string]string{
	"User":                    "lodestone",
	"Group":                   "lodestone",
	"NoNewPrivileges":         "yes",
	"ProtectSystem":           "strict",
	"ProtectHome":             "yes",
	"PrivateTmp":              "yes",
	"PrivateDevices":          "yes",
	"ProtectKernelTunables":   "yes",
	"ProtectKernelModules":    "yes",
	"ProtectControlGroups":    "yes",
	"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
	"RestrictNamespaces":      "yes",
	"RestrictSUIDSGID":        "yes",
	"MemoryDenyWriteExecute":  "yes",
	"LockPersonality":         "yes",
	"Restart":                 "on-failure",
	"EnvironmentFile":         "-/etc/lodestone/lodestone.env",
}

// service reads file's [Service] section: each key's values in order.
func service(t *testing.T, file string) map[string][]string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	opts, err := unit.DeserializeOptions(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	out := map[string][]string{}
	for _, o := range opts {
		if o.Section == "Service" {
			out[o.Name] = append(out[o.Name], o.Value)
		}
	}
	return out
}

func last(vs []string) string {
	if len(vs) == 0 {
		return "<unset>"
	}
	return vs[len(vs)-1]
}

func TestUnitsKeepTheirHardening(t *testing.T) {
	for _, u := range expected {
		t.Run(u.file, func(t *testing.T) {
			s := service(t, u.file)
			for key, want := range hardening {
				if got := last(s[key]); got != want {
					t.Errorf("%s=%s, want %s", key, got, want)
				}
			}
			if got := last(s["Type"]); got != u.typ {
				t.Errorf("Type=%s, want %s", got, u.typ)
			}
			// NB: an empty assignment is how a unit drops every capability.
			if got := last(s["CapabilityBoundingSet"]); got != u.caps {
				t.Errorf("CapabilityBoundingSet=%q, want %q", got, u.caps)
			}
			if got := last(s["AmbientCapabilities"]); got != u.caps {
				t.Errorf("AmbientCapabilities=%q, want %q", got, u.caps)
			}
			if !slices.Contains(s["SystemCallFilter"], "@system-service") {
				t.Errorf("SystemCallFilter=%q, want @system-service among them", s["SystemCallFilter"])
			}
			if n, err := strconv.Atoi(last(s["LimitNOFILE"])); err != nil || n < 65536 {
				t.Errorf("LimitNOFILE=%s, want at least 65536", last(s["LimitNOFILE"]))
			}
			if got := last(s["ReadWritePaths"]); u.writable != "" && got != u.writable {
				t.Errorf("ReadWritePaths=%s, want %s", got, u.writable)
			} else if u.writable == "" && len(s["ReadWritePaths"]) > 0 {
				t.Errorf("ReadWritePaths=%s, want none", got)
			}
			exec := strings.Fields(last(s["ExecStart"]))
			if len(exec) < 2 || exec[0] != installedBinary || exec[1] != u.subcommand {
				t.Errorf("ExecStart=%s, want %s %s ...", last(s["ExecStart"]), installedBinary, u.subcommand)
			}
			if got, want := last(s["ExecReload"]), "/bin/kill -HUP $MAINPID"; u.reload && got != want {
				t.Errorf("ExecReload=%s, want %s", got, want)
			}
		})
	}
}

// TestServerUnitStartsFromItsConfigFile pins what the server unit runs and
// how long it may wait for a quorum (the README explains the figure).
func TestServerUnitStartsFromItsConfigFile(t *testing.T) {
	s := service(t, "lodestone.service")
	if got, want := last(s["ExecStart"]), installedBinary+" server --config-file /etc/lodestone/server.hcl"; got != want {
		t.Errorf("ExecStart=%s, want %s", got, want)
	}
	if got := last(s["TimeoutStartSec"]); got != "10min" {
		t.Errorf("TimeoutStartSec=%s, want 10min: long enough for the other members to come up", got)
	}
	if got := last(s["WatchdogSec"]); got == "<unset>" {
		t.Error("no WatchdogSec: the server pings the watchdog while its Raft loop runs")
	}
}

// TestUnitsPassSystemdAnalyze runs systemd-analyze verify on each unit,
// with ExecStart pointing at a freshly built binary (verify checks that it
// exists), and fails on any complaint, warnings included; then checks the
// overall exposure score of systemd-analyze security stays at or below
// 2.0 ("OK").
func TestUnitsPassSystemdAnalyze(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian: apt-get install systemd); CI installs it")
	}
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin", "lodestone")
	build := exec.Command("go", "build", "-o", bin, "./cmd/lodestone")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, u := range expected {
		t.Run(u.file, func(t *testing.T) {
			text, err := os.ReadFile(u.file)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(text, []byte("ExecStart="+installedBinary+" ")) {
				t.Fatalf("ExecStart does not run %s", installedBinary)
			}
			path := filepath.Join(dir, u.file)
			text = bytes.ReplaceAll(text, []byte("ExecStart="+installedBinary+" "), []byte("ExecStart="+bin+" "))
			if err := os.WriteFile(path, text, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(analyze, "verify", path).CombinedOutput()
			if err != nil || len(bytes.TrimSpace(out)) > 0 {
				t.Errorf("systemd-analyze verify: %v\n%s", err, out)
			}
			out, err = exec.Command(analyze, "security", "--offline=true", "--threshold=20", path).CombinedOutput()
			if err != nil {
				t.Errorf("systemd-analyze security: exposure above 2.0 (%v)\n%s", err, out)
			}
		})
	}
}
