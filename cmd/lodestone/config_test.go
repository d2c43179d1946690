package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/internal/testnet"
	"github.com/lodestone-kv/lodestone/server"
)

// writeFile writes content to name in a new temporary directory.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// resolveArgs resolves `lodestone server args...` without starting it.
func resolveArgs(t *testing.T, env map[string]string, args ...string) (*resolvedServer, error) {
	t.Helper()
	cmd, _ := newServerFlags()
	if err := cmd.Flags().Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	src := serverSource{line: recordCommandLine(cmd.Flags()), getenv: func(k string) string { return env[k] }}
	return src.resolve()
}

func mustResolve(t *testing.T, env map[string]string, args ...string) *resolvedServer {
	t.Helper()
	r, err := resolveArgs(t, env, args...)
	if err != nil {
		t.Fatalf("resolve %v: %v", args, err)
	}
	return r
}

// readmeConfig is the HCL example of README.md's "Configuration file"
// section.
func readmeConfig(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)\n## Configuration file\n.*?```hcl\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no ```hcl block under ## Configuration file")
	}
	return string(m[1])
}

// TestReadmeConfigFileMatchesFlags: the README's example file yields
// exactly the server.Config of the same settings given as flags, and
// validate-config finds it valid (with real TLS files in place of its
// paths).
func TestReadmeConfigFileMatchesFlags(t *testing.T) {
	dir := createTLSFiles(t)
	hcl := strings.ReplaceAll(readmeConfig(t), "/etc/lodestone/", dir+"/")
	path := writeFile(t, "server.hcl", hcl)
	fromFile := mustResolve(t, nil, "--config-file", path)
	fromFlags := mustResolve(t, nil, "--name", "n1", "--data-dir", "/var/lib/lodestone",
		"--listen-peer", "10.0.0.1:7401", "--listen-grpc", "10.0.0.1:7400", "--listen-http", "10.0.0.1:8500",
		"--initial-cluster", "n1=10.0.0.1:7401,n2=10.0.0.2:7401,n3=10.0.0.3:7401", "--cluster-token", "prod-eu-1",
		"--tls-ca-file", filepath.Join(dir, "lodestone-ca.pem"),
		"--tls-cert-file", filepath.Join(dir, "server-n1.pem"), "--tls-key-file", filepath.Join(dir, "server-n1-key.pem"),
		"--tls-verify-incoming-grpc", "--tls-verify-incoming-http",
		"--acl-enabled", "--acl-default-policy", "deny",
		"--max-value-bytes", "1048576", "--connection-limit-exempt", "10.0.0.0/24", "--rpc-hold-timeout", "10s",
		"--log-format", "json")
	if !reflect.DeepEqual(fromFile.cfg, fromFlags.cfg) {
		t.Fatalf("the README's file and its flags differ:\nfile:  %+v\nflags: %+v", fromFile.cfg, fromFlags.cfg)
	}
	if fromFile.opts.logFormat != "json" || fromFile.cfg.ACL.DefaultPolicy != acl.AccessDeny || len(fromFile.cfg.InitialCluster) != 3 {
		t.Fatalf("the file was not read: %+v", fromFile.cfg)
	}
	r := cli(t, nil, "", "validate-config", path).ok(t)
	if r.stdout != path+": valid\n" {
		t.Fatalf("validate-config printed %q", r.stdout)
	}
}

// TestConfigPrecedence: a flag beats LODESTONE_<KEY>, which beats the
// last file, which beats an earlier file, which beats the default; the
// older special variables keep working, and unknown or hidden keys in the
// environment are left alone.
func TestConfigPrecedence(t *testing.T) {
	first := writeFile(t, "a.hcl", `
data_dir        = "from-first-file"
max_value_bytes = 1000
max_txn_ops     = 10
log_level       = "error"
gossip_join     = ["a:1", "b:2"]
`)
	second := writeFile(t, "b.json", `{"max_txn_ops": 20, "tls": {"peer_server_name": "peers.example"}}`)
	env := map[string]string{
		"LODESTONE_DATA_DIR":        "from-env",
		"LODESTONE_MAX_VALUE_BYTES": "2000",
		"LODESTONE_GOSSIP_KEY":      "old-variable-key",
		"LODESTONE_DATA_DRI":        "a typo: not a key, not an error",
		"LODESTONE_FAULT_HOOKS":     "true", // hidden: no key
		"LODESTONE_TOKEN":           "a client variable",
	}
	r := mustResolve(t, env, "--config-file", first, "--config-file", second, "--data-dir", "from-flag")
	c := r.cfg
	for _, check := range []struct {
		what      string
		got, want any
	}{
		{"data_dir (flag over env and file)", c.DataDir, "from-flag"},
		{"max_value_bytes (env over file)", c.Limits.MaxValueBytes, 2000},
		{"max_txn_ops (second file over first)", c.Limits.MaxTxnOps, 20},
		{"tls_peer_server_name (nested block)", c.TLS.PeerServerName, "peers.example"},
		{"gossip_join (list)", c.Gossip.Pool.Join, []string{"a:1", "b:2"}},
		{"log_level (file over default)", r.opts.logLevel, "error"},
		{"max_key_bytes (default)", c.Limits.MaxKeyBytes, server.DefaultConfig().Limits.MaxKeyBytes},
		{"gossip_encrypt (LODESTONE_GOSSIP_KEY)", c.Gossip.Pool.EncryptKey, "old-variable-key"},
		{"fault hooks (hidden, no key)", c.Faults == nil, true},
	} {
		if !reflect.DeepEqual(check.got, check.want) {
			t.Errorf("%s = %v, want %v", check.what, check.got, check.want)
		}
	}
	env["LODESTONE_GOSSIP_ENCRYPT"] = "key-variable"
	env["LODESTONE_GOSSIP_JOIN"] = "c:3, d:4"
	r = mustResolve(t, env, "--config-file", first)
	if got := r.cfg.Gossip.Pool.EncryptKey; got != "key-variable" {
		t.Errorf("LODESTONE_GOSSIP_ENCRYPT beside LODESTONE_GOSSIP_KEY: %q, want the key's own variable", got)
	}
	if got := r.cfg.Gossip.Pool.Join; !reflect.DeepEqual(got, []string{"c:3", "d:4"}) {
		t.Errorf("LODESTONE_GOSSIP_JOIN: %v, want [c:3 d:4]", got)
	}
}

// TestACLDefaultPolicyAllowReachesTheServer: --acl-default-policy allow
// used to be set on a copy the server never saw.
func TestACLDefaultPolicyAllowReachesTheServer(t *testing.T) {
	if got := mustResolve(t, nil, "--acl-default-policy", "allow").cfg.ACL.DefaultPolicy; got != acl.AccessWrite {
		t.Fatalf("--acl-default-policy allow: %v, want %v", got, acl.AccessWrite)
	}
}

// TestConfigFileErrors: each mistake stops `lodestone server` before it
// starts, with where it is and what is allowed.
func TestConfigFileErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, file, content string
		env                 map[string]string
		wants               []string
	}{
		{"unknown key", "server.hcl", "name = \"n1\"\n\ndata_dri = \"/d\"\n", nil,
			[]string{"unknown key data_dri at ", "server.hcl:3:1: did you mean data_dir?"}},
		{"dashes", "server.hcl", `data-dir = "/d"`, nil, []string{"unknown key data-dir", "did you mean data_dir?"}},
		{"nothing close", "server.hcl", `colour = "blue"`, nil, []string{"unknown key colour", "flag names with '_' for '-'"}},
		{"unknown JSON key", "server.json", "{\n  \"max_value_byte\": 5\n}", nil,
			[]string{"unknown key max_value_byte at ", "server.json:2:19: did you mean max_value_bytes?"}},
		{"string for a number", "server.hcl", "\nmax_value_bytes = \"1MB\"", nil,
			[]string{"key max_value_bytes at ", "server.hcl:2:1: got a string, want an integer"}},
		{"number for a duration", "server.hcl", "rpc_hold_timeout = 5", nil,
			[]string{"key rpc_hold_timeout", "got an integer, want a duration in a string, such as \"5s\""}},
		{"string for a list", "server.hcl", `gossip_join = "a:1"`, nil, []string{"key gossip_join", "got a string, want a list of strings"}},
		{"number in a list", "server.hcl", `connection_limit_exempt = ["10.0.0.0/8", 7]`, nil,
			[]string{"key connection_limit_exempt", "element 2: got an integer, want a string"}},
		{"bad duration", "server.hcl", `rpc_hold_timeout = "soon"`, nil,
			[]string{"key rpc_hold_timeout at ", `invalid duration "soon"`, "want a duration"}},
		{"bad network", "server.hcl", `connection_limit_exempt = ["10.0.0.0/33"]`, nil,
			[]string{"key connection_limit_exempt at ", `"10.0.0.0/33" is not a CIDR network`}},
		{"twice", "server.hcl", "name = \"a\"\nname = \"b\"\n", nil, []string{"key name at ", "server.hcl:2:1 is set again (first at ", "server.hcl:1:1)"}},
		{"no value", "server.hcl", "name = \"a\"\nlisten_grpc = \n", nil, []string{"config file ", "server.hcl:2:13: '=' with no value after it"}},
		{"syntax", "server.hcl", "name = \"a\"\nlisten_grpc = = 1\n", nil, []string{"config file ", "server.hcl:2:15: "}},
		{"extension", "server.conf", `name = "a"`, nil, []string{"server.conf: the extension picks the format: name it .hcl or .json"}},
		{"bad environment value", "server.hcl", `name = "a"`, map[string]string{"LODESTONE_MAX_TXN_OPS": "many"},
			[]string{`LODESTONE_MAX_TXN_OPS="many": `, "want an integer"}},
		{"bad environment bool", "server.hcl", `name = "a"`, map[string]string{"LODESTONE_ACL_ENABLED": "yes please"},
			[]string{`LODESTONE_ACL_ENABLED="yes please"`, "want true or false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, tc.file, tc.content)
			cli(t, tc.env, "", "server", "--config-file", path, "--data-dir", t.TempDir()).failed(t, 1, tc.wants...)
		})
	}
	t.Run("client flags before server", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, "server.hcl", `max_txn_ops = "many"`)
		cli(t, nil, "", "--timeout", "5s", "server", "--config-file", path).failed(t, 1, "key max_txn_ops at ", "got a string, want an integer")
	})
	t.Run("missing file", func(t *testing.T) {
		t.Parallel()
		cli(t, nil, "", "server", "--config-file", "/nonexistent/server.hcl").failed(t, 1, "config file: open /nonexistent/server.hcl")
	})
}

// TestValidateConfig: a good file is "valid"; a bad one lists each
// problem, from the file's keys to the server's own checks and the TLS
// files, and exits 1.
func TestValidateConfig(t *testing.T) {
	t.Parallel()
	good := writeFile(t, "good.hcl", "name = \"n1\"\ndata_dir = \"/var/lib/lodestone\"\n")
	if r := cli(t, nil, "", "validate-config", good).ok(t); r.stdout != good+": valid\n" || r.stderr != "" {
		t.Fatalf("good file: %+v", r)
	}
	for _, tc := range []struct {
		name, content string
		wants         []string
	}{
		{"keys and types", "name = \"n1\"\ndata_dri = \"/d\"\nmax_txn_ops = true\n",
			[]string{"unknown key data_dri at ", "did you mean data_dir?", "key max_txn_ops at ", "got a bool, want an integer", "(2 problems above)"}},
		{"server checks", `name = "n1"
data_dir = "/d"
acl_default_policy = "maybe"
log_level = "loud"
initial_cluster = "n1"
`, []string{`--acl-default-policy "maybe": use deny or allow`, `--log-level "loud": use debug, info, warn or error`, "--initial-cluster: ", "(3 problems above)"}},
		{"config", "data_dir = \"/d\"\n", []string{"config name: must not be empty"}},
		{"plain text off loopback", "name = \"n1\"\ndata_dir = \"/d\"\nlisten_grpc = \"10.0.0.1:7400\"\n",
			[]string{"refusing to listen in plain text on --listen-grpc 10.0.0.1:7400"}},
		{"TLS files", "name = \"n1\"\ndata_dir = \"/d\"\ntls_ca_file = \"/nonexistent/ca.pem\"\ntls_cert_file = \"/nonexistent/c.pem\"\ntls_key_file = \"/nonexistent/k.pem\"\n",
			[]string{"TLS: ", "/nonexistent/"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, "server.hcl", tc.content)
			r := cli(t, nil, "", "validate-config", path)
			if r.code != 1 || r.stdout != "" {
				t.Fatalf("exit %d stdout %q, want 1 and nothing", r.code, r.stdout)
			}
			for _, w := range tc.wants {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, r.stderr)
				}
			}
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if last := lines[len(lines)-1]; !strings.HasPrefix(last, "lodestone: "+path+": not valid (") || !strings.HasSuffix(last, " above)") {
				t.Errorf("stderr does not end with the verdict:\n%s", r.stderr)
			}
		})
	}
	t.Run("certificate of another CA", func(t *testing.T) {
		t.Parallel()
		ours, theirs := createTLSFiles(t), createTLSFiles(t)
		path := writeFile(t, "server.hcl", "name = \"n1\"\ndata_dir = \"/d\"\n"+
			"tls_ca_file = \""+filepath.Join(theirs, "lodestone-ca.pem")+"\"\n"+
			"tls_cert_file = \""+filepath.Join(ours, "server-n1.pem")+"\"\n"+
			"tls_key_file = \""+filepath.Join(ours, "server-n1-key.pem")+"\"\n")
		if r := cli(t, nil, "", "validate-config", path); r.code != 1 || !strings.Contains(r.stderr, "does not chain to the CA bundle") {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
	})
	cli(t, nil, "", "validate-config").failed(t, 2, "want FILE...")
}

// TestLiveKeys: every live key is a flag's key, and changing it changes
// what Reload takes; keys fixed at start do not.
func TestLiveKeys(t *testing.T) {
	base := mustResolve(t, nil)
	keys := configFlags(base.flags)
	for key := range liveKeys {
		if keys[key] == nil {
			t.Errorf("live key %s is no flag's key", key)
		}
	}
	changes := map[string]string{
		"max_key_bytes": "100", "max_value_bytes": "100", "max_txn_ops": "3", "max_range_keys": "7",
		"max_txn_request_bytes": "100", "max_range_response_bytes": "100000",
		"max_watches_per_stream": "3", "max_watches_per_connection": "9",
		"max_grpc_connections_per_client": "3", "max_http_connections_per_client": "3",
		"connection_limit_exempt": "10.0.0.0/8",
		// fixed at start:
		"data_dir": "/elsewhere", "listen_http": "127.0.0.1:1", "max_request_bytes": "100000000", "http_idle_timeout": "1s",
		"max_connections": "5",
	}
	for key, value := range changes {
		r := mustResolve(t, nil, "--"+strings.ReplaceAll(key, "_", "-"), value)
		if changed := !reflect.DeepEqual(r.cfg.Live(), base.cfg.Live()); changed != liveKeys[key] {
			t.Errorf("%s=%s changes Live(): %v, want %v", key, value, changed, liveKeys[key])
		}
	}
}

// TestServerReloadsConfigOnSIGHUP runs a real `lodestone server` from a
// file, changes the file and sends SIGHUP: the new value limit and log
// level apply, a listen address is left for a restart with a warning, and
// a broken file changes nothing.
func TestServerReloadsConfigOnSIGHUP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "lodestone")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	grpcAddr, httpAddr := testnet.FreeAddr(t), testnet.FreeAddr(t)
	base := "name = \"n1\"\ndata_dir = \"" + t.TempDir() + "\"\nlisten_peer = \"" + testnet.FreeAddr(t) + "\"\n" +
		"listen_grpc = \"" + grpcAddr + "\"\n"
	path := writeFile(t, "server.hcl", base+"listen_http = \""+httpAddr+"\"\nlog_level = \"warn\"\nmax_value_bytes = 1024\n")
	var logs syncWriter
	cmd := exec.Command(bin, "server", "--config-file", path)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("server: %s", logs.String())
		}
	}()
	// The counter is registered before SIGHUP is caught: once it shows,
	// SIGHUP reloads instead of ending the process.
	waitMetric(t, httpAddr, `lodestone_config_reloads_total{result="ok"} 0`)
	c, err := client.New(client.Config{Endpoints: []string{grpcAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := c.Put(ctx, "small", []byte("x")); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("first write: %v", err)
		}
	}
	big := []byte(strings.Repeat("v", 2000))
	if _, err := c.Put(ctx, "big", big); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("2000 bytes under max_value_bytes 1024: %v, want invalid argument", err)
	}
	if strings.Contains(logs.String(), "server started") {
		t.Fatal("an info line was logged at log_level warn")
	}

	newHTTP := testnet.FreeAddr(t)
	if err := os.WriteFile(path, []byte(base+"listen_http = \""+newHTTP+"\"\nlog_level = \"info\"\nmax_value_bytes = 4096\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, httpAddr, `lodestone_config_reloads_total{result="ok"} 1`)
	if _, err := c.Put(ctx, "big", big); err != nil {
		t.Fatalf("2000 bytes after max_value_bytes 4096 was reloaded: %v", err)
	}
	// NB: the counter moves before the log line has come through the
	// pipe, so each line is waited for.
	for _, want := range []string{
		`level=INFO msg="configuration reloaded" changed="[log_level=info max_value_bytes=4096]"`, // NB: info: the new level
		`level=WARN msg="configuration key changed, but it takes a restart: the running value stays" key=listen_http`,
	} {
		waitFor(t, 10*time.Second, "log line "+want, func() bool { return strings.Contains(logs.String(), want) })
	}

	if err := os.WriteFile(path, []byte(base+"max_value_bytes = \"a lot\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, httpAddr, `lodestone_config_reloads_total{result="error"} 1`)
	waitFor(t, 10*time.Second, "log line saying the broken file was refused", func() bool {
		return strings.Contains(logs.String(), "configuration not reloaded: the running one stays")
	})
	if _, err := c.Put(ctx, "big", big); err != nil {
		t.Fatalf("after a broken file: %v, want the 4096-byte limit still in force", err)
	}
}

// waitMetric polls addr's /metrics until it has line.
func waitMetric(t *testing.T, addr, line string) {
	t.Helper()
	var body []byte
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			continue
		}
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && strings.Contains(string(body), "\n"+line+"\n") {
			return
		}
	}
	t.Fatalf("/metrics never had %s; last:\n%s", line, grepLines(string(body), "lodestone_config_reloads_total"))
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
