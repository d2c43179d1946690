package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"
)

// The gateway reads its flags from a file and LODESTONE_GATEWAY_<KEY>: the
// command line wins over the environment, which wins over the file.
func TestGatewayConfigFileAndEnv(t *testing.T) {
	fileListen, fileAdmin, envAdmin, flagListen := testnet.FreeAddr(t), testnet.FreeAddr(t), testnet.FreeAddr(t), testnet.FreeAddr(t)
	file := filepath.Join(t.TempDir(), "gateway.hcl")
	writeTestFile(t, file, `listen = "`+fileListen+`"
admin    = "`+fileAdmin+`"
registry = ["127.0.0.1:1"]
max_retries = 1
log_level   = "warn"
`)
	env := map[string]string{"LODESTONE_GATEWAY_ADMIN": envAdmin, "LODESTONE_ADMIN": "127.0.0.1:2"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncWriter
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"gateway", "--config-file", file, "--listen", flagListen}, strings.NewReader(""), &out, &errb,
			func(k string) string { return env[k] })
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "lodestone gateway is running") {
		select {
		case code := <-done:
			t.Fatalf("gateway exited %d: %s", code, errb.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway did not start within 10s: %s", errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{"proxy:    http://" + flagListen, "admin:    http://" + envAdmin} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("gateway output lacks %q:\n%s", want, out.String())
		}
	}
	cancel()
	if code := <-done; code != 0 && code != 130 {
		t.Errorf("gateway exited %d: %s", code, errb.String())
	}
}

func TestGatewayConfigFileErrors(t *testing.T) {
	dir := t.TempDir()
	misspelt := filepath.Join(dir, "misspelt.hcl")
	writeTestFile(t, misspelt, "listen = \"127.0.0.1:0\"\nmax_retires = 2\n")
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"gateway", "--config-file", misspelt}, strings.NewReader(""), &out, &errb, func(string) string { return "" })
	if code != 1 || !strings.Contains(errb.String(), "misspelt.hcl:2") || !strings.Contains(errb.String(), "max_retries") {
		t.Errorf("exit %d, stderr %q; want 1 naming misspelt.hcl:2 and max_retries", code, errb.String())
	}

	good := filepath.Join(dir, "good.hcl")
	writeTestFile(t, good, "listen = \"127.0.0.1:8080\"\nadmin = \"127.0.0.1:8081\"\nshards = 16\n")
	bad := filepath.Join(dir, "bad.hcl")
	writeTestFile(t, bad, "listen = \"127.0.0.1:8080\"\nshards = 12\n")
	for _, tc := range []struct {
		file string
		code int
		want string
	}{{good, 0, "good.hcl: valid"}, {bad, 1, "Shards"}, {misspelt, 1, "max_retries"}} {
		out.Reset()
		errb.Reset()
		code := run(context.Background(), []string{"validate-config", "--gateway", tc.file}, strings.NewReader(""), &out, &errb, func(string) string { return "" })
		if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.want) {
			t.Errorf("validate-config --gateway %s: exit %d, %q %q; want exit %d and %q", filepath.Base(tc.file), code, out.String(), errb.String(), tc.code, tc.want)
		}
	}
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
