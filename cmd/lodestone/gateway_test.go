package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/internal/testnet"
	"github.com/lodestone-kv/lodestone/server/servertest"
)

// gatewayRoot returns the root command with `gateway` registered (main.go
// may or may not register it yet).
func gatewayRoot(env map[string]string) *cobra.Command {
	root := newRootCmd(func(k string) string { return env[k] })
	if c, _, err := root.Find([]string{"gateway"}); err != nil || c == root {
		root.AddCommand(newGatewayCmd(func(k string) string { return env[k] }))
	}
	return root
}

func runGatewayCLI(ctx context.Context, stdout, stderr io.Writer, args ...string) int {
	root := gatewayRoot(nil)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "lodestone: "+oneLine(err.Error()))
	if _, ok := err.(*usageError); ok {
		return 2
	}
	return 1
}

func TestGatewayBadFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"bad shards", []string{"gateway", "--shards", "12", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, 1, "Shards"},
		{"bad listen", []string{"gateway", "--listen", "8080"}, 1, "Listen"},
		{"unknown flag", []string{"gateway", "--nope"}, 2, "unknown flag"},
		{"bad instances source", []string{"gateway", "--instances", "dns", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, 1, "Instances"},
		{"bad routes file", []string{"gateway", "--routes", "/nonexistent/routes.json", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, 1, "routes file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := runGatewayCLI(context.Background(), &out, &errb, tc.args...)
			if code != tc.code || !strings.Contains(errb.String(), tc.want) || strings.Count(errb.String(), "\n") != 1 {
				t.Errorf("exit %d stderr %q; want exit %d and one line containing %q", code, errb.String(), tc.code, tc.want)
			}
		})
	}
}

// TestGatewayEndToEnd: `lodestone gateway` against a real registry routes
// to an instance registered in the catalog (the default source), with a static route from --routes and
// a registry route added while it runs; it exits 0 on interrupt.
func TestGatewayEndToEnd(t *testing.T) {
	origin := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "origin %s", r.URL.Path)
	})}
	oln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go origin.Serve(oln)
	defer origin.Close()

	srv := servertest.Start(t, nil)
	c, err := client.New(client.Config{Endpoints: []string{srv.GRPCAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	host, port, _ := net.SplitHostPort(oln.Addr().String())
	p, _ := strconv.Atoi(port)
	if _, err := c.Register(ctx, &lodestonepb.CatalogRegisterRequest{
		Node:    &lodestonepb.Node{Name: "n1", Address: host},
		Service: &lodestonepb.Service{Id: "w1", Name: "web", Port: uint32(p)},
	}); err != nil {
		t.Fatal(err)
	}

	routes := filepath.Join(t.TempDir(), "routes.json")
	os.WriteFile(routes, []byte(`{"routes": [{"name": "static", "path_prefix": "/static/", "service": "web"}]}`), 0o644)
	listen, admin := testnet.FreeAddr(t), testnet.FreeAddr(t)
	runCtx, stop := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- runGatewayCLI(runCtx, pw, &errb, "gateway", "--registry", srv.GRPCAddr(), "--listen", listen, "--admin", admin,
			"--routes", routes, "--state-dir", t.TempDir(), "--log-level", "warn")
		pw.Close()
	}()
	first, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil || first != "lodestone gateway is running\n" {
		t.Fatalf("first line %q (%v); stderr %s", first, err, errb.String())
	}
	go io.Copy(io.Discard, pr)

	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	getBody := func(url string) (int, string) {
		resp, err := hc.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Poll until the condition holds (the gateway loads the registry
	// asynchronously); bounded by ctx.
	until := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("timed out waiting for %s", what)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	until("readyz", func() bool { code, _ := getBody("http://" + admin + "/readyz"); return code == 200 })
	until("the static route", func() bool { _, b := getBody("http://" + listen + "/static/x"); return b == "origin /static/x" })

	if _, err := c.Put(ctx, "gateway/routes/all", []byte(`{"path_prefix": "/", "service": "web"}`)); err != nil {
		t.Fatal(err)
	}
	until("the registry route", func() bool { _, b := getBody("http://" + listen + "/other"); return b == "origin /other" })

	code, body := getBody("http://" + admin + "/routes")
	var view struct {
		Routes []struct{ Name, From string }
	}
	if code != 200 || json.Unmarshal([]byte(body), &view) != nil || len(view.Routes) != 2 {
		t.Errorf("/routes: %d %s", code, body)
	}
	stop()
	if code := <-done; code != 0 {
		t.Errorf("exit %d after interrupt, want 0; stderr %s", code, errb.String())
	}
}
