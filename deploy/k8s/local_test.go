package k8s

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestManifestsRunLocally runs the pods' own command lines as local
// processes with the Secret make-secret.sh printed, its keys written
// where the pods mount them: a server (a one-member cluster, on loopback
// ports instead of the pod's), its probes as the kubelet sends them, the
// ACL Job's steps twice, and the gateway with the token the Job created.
// Only addresses change; TLS still verifies the DNS names the manifests
// dial.
func TestManifestsRunLocally(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and a gateway")
	}
	bin := lodestoneBinary(t)
	m, _ := generated(t)
	sts := m.statefulSet("lodestone")
	serverPod := workloadOf(t, m, "apps/v1/StatefulSet", sts.Name)
	srv := &sts.Spec.Template.Spec.Containers[0]

	grpc, peer, httpPort, gossip := freePort(t, false), freePort(t, false), freePort(t, false), freePort(t, true)
	loop := func(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }
	overrides := map[string]string{
		"listen-grpc": loop(grpc), "listen-peer": loop(peer), "listen-http": loop(httpPort),
		"advertise-grpc": loop(grpc), "advertise-http": loop(httpPort), "agent-address": "127.0.0.1",
		"initial-cluster": sts.Name + "-0=" + loop(peer),
		"gossip-listen":   loop(gossip), "gossip-advertise": loop(gossip), "gossip-join": loop(gossip),
	}
	fields := map[string]string{"metadata.name": sts.Name + "-0", "status.podIP": "127.0.0.1"}
	root := filepath.Join(t.TempDir(), "server")
	args, env := localCommand(t, bin, m, serverPod, srv, root, fields, overrides)
	start(t, bin, args, env)

	// The kubelet's probes: HTTPS without verifying, no client
	// certificate, no token.
	kubelet := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, probe := range []*corev1.Probe{srv.ReadinessProbe, srv.LivenessProbe, srv.StartupProbe} {
		u := fmt.Sprintf("%s://127.0.0.1:%d%s", strings.ToLower(string(probe.HTTPGet.Scheme)), httpPort, probe.HTTPGet.Path)
		waitOK(t, kubelet, u, nil, 30*time.Second)
	}

	// The Job, twice: the second run must find everything done and pass.
	job := workloadOf(t, m, "batch/v1/Job", "lodestone-acl-init")
	jobRoot := filepath.Join(t.TempDir(), "job")
	for run := 1; run <= 2; run++ {
		for _, c := range allContainers(job.spec) {
			args, env := localCommand(t, bin, m, job, c, jobRoot, nil, nil)
			env = pointAtLocalServer(t, env, httpPort)
			out, errOut, err := runWithEnv(bin, args, env)
			if err != nil {
				t.Fatalf("Job run %d, step %s: %v\nstdout: %s\nstderr: %s", run, c.Name, err, out, errOut)
			}
			if run == 2 && c.Name == "bootstrap" && !strings.Contains(errOut, "already bootstrapped") {
				t.Errorf("second run's bootstrap stderr %q does not say it found the system bootstrapped", errOut)
			}
		}
	}
	gatewaySecret := secretValue(m.secret("lodestone-secrets"), "gateway-token")
	self, errOut, err := runWithEnv(bin, []string{"acl", "token", "read", "--self", "--format", "json"},
		pointAtLocalServer(t, []string{"LODESTONE_HTTP_ADDR=https://lodestone.lodestone.svc:8500",
			"LODESTONE_CACERT=" + filepath.Join(jobRoot, "etc/lodestone/tls/ca.pem"), "LODESTONE_TOKEN=" + gatewaySecret}, httpPort))
	var tok struct{ Policies []struct{ Name string } }
	if err != nil || json.Unmarshal([]byte(self), &tok) != nil || len(tok.Policies) != 1 || tok.Policies[0].Name != "gateway" {
		t.Fatalf("the gateway's token after two Job runs: %v %s\n%s", err, errOut, self)
	}

	// The gateway, with that token, must get a routing table: ready.
	gw := workloadOf(t, m, "apps/v1/Deployment", "lodestone-gateway")
	gc := &gw.spec.Containers[0]
	registry, _ := parseCmdline(gc)
	registryHost, _, _ := net.SplitHostPort(registry.flag("registry"))
	admin := freePort(t, false)
	args, env = localCommand(t, bin, m, gw, gc, filepath.Join(t.TempDir(), "gateway"), nil, map[string]string{
		"registry": loop(grpc), "listen": loop(freePort(t, false)), "admin": loop(admin),
	})
	start(t, bin, append(args, "--tls-server-name="+registryHost), env)
	client := &http.Client{Timeout: 2 * time.Second}
	waitOK(t, client, fmt.Sprintf("http://127.0.0.1:%d%s", admin, gc.ReadinessProbe.HTTPGet.Path), nil, 30*time.Second)
	waitOK(t, client, fmt.Sprintf("http://127.0.0.1:%d%s", admin, gc.LivenessProbe.HTTPGet.Path), nil, 5*time.Second)
	routes := fmt.Sprintf("http://127.0.0.1:%d/routes", admin)
	if resp, err := client.Get(routes); err != nil || resp.StatusCode != 403 {
		t.Errorf("/routes without the admin token: %v %v, want 403", resp, err)
	} else {
		resp.Body.Close()
	}
	// Connected: the token's policy lets every watch the gateway needs run.
	adminToken := secretValue(m.secret("lodestone-secrets"), "gateway-admin-token")
	deadline := time.Now().Add(10 * time.Second)
	for {
		body := waitOK(t, client, routes, map[string]string{"X-Consul-Token": adminToken}, 5*time.Second)
		var table struct{ Connected bool }
		if err := json.Unmarshal(body, &table); err != nil {
			t.Fatalf("/routes: %v\n%s", err, body)
		}
		if table.Connected {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/routes: not connected to the registry within 10s:\n%s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func workloadOf(t *testing.T, m *manifests, kind, name string) workload {
	t.Helper()
	for _, w := range m.workloads() {
		if w.kind == kind && w.obj.GetName() == name {
			return w
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return workload{}
}

// localCommand turns a container into a local command line and
// environment: Secret and ConfigMap keys written under root where the pod
// mounts them, other volumes as directories there, paths moved under
// root, $(VAR) filled in, the flags in overrides given new values, and
// pending flags the binary lacks left out.
func localCommand(t *testing.T, bin string, m *manifests, w workload, c *corev1.Container, root string, fields, overrides map[string]string) (args, env []string) {
	t.Helper()
	materialize(t, m, w, c, root)
	relocate := func(s string) string {
		for _, vm := range c.VolumeMounts {
			for _, prefix := range []string{"", "@"} {
				if rest, ok := strings.CutPrefix(s, prefix+vm.MountPath); ok && (rest == "" || rest[0] == '/') {
					return prefix + filepath.Join(root, vm.MountPath) + rest
				}
			}
		}
		return s
	}
	vars := envValues(m, c, fields)
	for _, a := range c.Args {
		a, _ = expand(a, vars)
		name, value, isFlag := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		switch {
		case !strings.HasPrefix(a, "--"):
			a = relocate(a)
		case overrides[name] != "":
			a = "--" + name + "=" + overrides[name]
		case isFlag:
			a = "--" + name + "=" + relocate(value)
		}
		args = append(args, a)
	}
	env = []string{"PATH=" + os.Getenv("PATH")}
	for _, e := range c.Env {
		v := vars[e.Name]
		if fileEnv[e.Name] {
			v = relocate(v)
		}
		env = append(env, e.Name+"="+v)
	}
	return args, env
}

// materialize writes what c's mounts hold under root.
func materialize(t *testing.T, m *manifests, w workload, c *corev1.Container, root string) {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		dir := filepath.Join(root, vm.MountPath)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		v := volume(w.spec, vm.Name)
		files := map[string]string{}
		switch {
		case v == nil: // a claim template: an empty directory
		case v.Secret != nil:
			for _, it := range v.Secret.Items {
				files[it.Path] = secretValue(m.secret(v.Secret.SecretName), it.Key)
			}
		case v.ConfigMap != nil:
			for _, it := range v.ConfigMap.Items {
				files[it.Path] = m.configMap(v.ConfigMap.Name).Data[it.Key]
			}
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// pointAtLocalServer sends the CLI's HTTP calls to the local server while
// TLS still verifies the host LODESTONE_HTTP_ADDR names.
func pointAtLocalServer(t *testing.T, env []string, httpPort int) []string {
	t.Helper()
	out := slices.Clone(env)
	for i, kv := range out {
		if v, ok := strings.CutPrefix(kv, "LODESTONE_HTTP_ADDR="); ok {
			u, err := url.Parse(v)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, "LODESTONE_TLS_SERVER_NAME="+u.Hostname())
			u.Host = fmt.Sprintf("127.0.0.1:%d", httpPort)
			out[i] = "LODESTONE_HTTP_ADDR=" + u.String()
			return out
		}
	}
	t.Fatalf("no LODESTONE_HTTP_ADDR in %v", env)
	return nil
}

// start runs a long-lived process until the test ends; its output is
// shown if the test fails.
func start(t *testing.T, bin string, args, env []string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("lodestone %s did not stop within 15s of SIGTERM", args[0])
		}
		if t.Failed() {
			t.Logf("lodestone %s output:\n%s", args[0], out.String())
		}
	})
}

func runWithEnv(bin string, args, env []string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// waitOK polls url until it answers 200, and returns the body.
func waitOK(t *testing.T, c *http.Client, url string, header map[string]string, within time.Duration) []byte {
	t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err == nil {
			var body bytes.Buffer
			body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return body.Bytes()
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(body.String()))
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: no 200 within %v; last: %s", url, within, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freePort returns a loopback port free now, for TCP (and UDP with udp).
func freePort(t *testing.T, udp bool) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !udp {
			return port
		}
		if u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}
