package compose

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/lodestone-kv/lodestone/internal/testnet"
)

var servers = []string{"server1", "server2", "server3"}

// cluster is one compose project of this test: its image, ports, subnet
// and secrets, and the commands that drive it.
type cluster struct {
	root    string // the repository
	file    string // docker-compose.yml
	project string
	repo    string // image repository; tags v1 and v2
	secrets string
	subnet  string // the compose network's first three octets
	// image is the LODESTONE_IMAGE docker-compose commands run with.
	image       string
	httpPort    map[string]string // server -> published HTTP port
	grpcPort    map[string]string
	gatewayPort string
}

// requireDocker skips the test unless Docker, docker-compose, make and
// root (make compose-up gives key files to the containers' user) are
// there.
func requireDocker(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("the compose cluster test takes minutes; skipped with -short")
	}
	for _, probe := range [][]string{{"docker", "info"}, {"docker-compose", "version"}, {"make", "--version"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, probe[0], probe[1:]...).CombinedOutput()
		cancel()
		if err != nil {
			t.Skipf("skipped: %q failed (%v), so there is no Docker, docker-compose or make to run the compose cluster with: %s",
				strings.Join(probe, " "), err, firstLine(out))
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("skipped: make compose-up must run as root (it gives each container's key files to the containers' user)")
	}
}

// newCluster names a fresh project, image, ports and subnet, and
// registers its teardown (with diagnostics on failure) before anything
// starts.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	c := &cluster{
		root: root, file: filepath.Join(root, "deploy", "compose", "docker-compose.yml"),
		project: "lodestonetest" + suffix, repo: "lodestone-composetest-" + suffix,
		secrets: t.TempDir(), subnet: freeSubnet(t),
		httpPort: map[string]string{}, grpcPort: map[string]string{},
	}
	port := func() string {
		_, p, _ := net.SplitHostPort(testnet.FreeAddr(t))
		return p
	}
	for _, s := range servers {
		c.httpPort[s], c.grpcPort[s] = port(), port()
	}
	c.gatewayPort = port()
	c.image = c.repo + ":v1"
	t.Cleanup(func() { c.teardown(t) })
	return c
}

// env is the environment of every make and docker-compose command.
func (c *cluster) env() []string {
	env := append(os.Environ(),
		"COMPOSE_PROJECT_NAME="+c.project,
		"LODESTONE_IMAGE="+c.image,
		"LODESTONE_SECRETS="+c.secrets,
		"LODESTONE_SUBNET_PREFIX="+c.subnet,
		"LODESTONE_GATEWAY_PORT="+c.gatewayPort,
		"LODESTONE_UP_TIMEOUT=90",
	)
	for i, s := range servers {
		env = append(env, fmt.Sprintf("LODESTONE_SERVER%d_HTTP_PORT=%s", i+1, c.httpPort[s]),
			fmt.Sprintf("LODESTONE_SERVER%d_GRPC_PORT=%s", i+1, c.grpcPort[s]))
	}
	return env
}

// run runs a command with the cluster's environment, bounded by within,
// and returns its combined output.
func (c *cluster) run(within time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env, cmd.Dir = c.env(), c.root
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("not done within %v: %w", within, err)
	}
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return string(out), nil
}

// must runs a command and fails the test with its output's tail if it
// fails.
func (c *cluster) must(t *testing.T, within time.Duration, name string, args ...string) string {
	t.Helper()
	out, err := c.run(within, name, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(out, 4000))
	}
	return out
}

func (c *cluster) compose(t *testing.T, within time.Duration, args ...string) string {
	t.Helper()
	return c.must(t, within, "docker-compose", append([]string{"-f", c.file}, args...)...)
}

// makeImage builds the image tagged repo:tag (make image).
func (c *cluster) makeImage(t *testing.T, tag string) {
	t.Helper()
	out := c.must(t, 8*time.Minute, "make", "--no-print-directory", "image", "IMAGE="+c.repo, "VERSION="+tag)
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "IMAGE ") {
			t.Log(line)
		}
	}
}

// up runs make compose-up for this project.
func (c *cluster) up(t *testing.T) {
	t.Helper()
	out := c.must(t, 5*time.Minute, "make", "--no-print-directory", "compose-up", "IMAGE="+c.repo,
		"COMPOSE_PROJECT="+c.project, "COMPOSE_IMAGE="+c.image, "COMPOSE_SECRETS="+c.secrets)
	t.Logf("make compose-up:\n%s", tail(out, 1500))
}

// teardown prints what a failure needs, removes the project with its
// volumes and secrets, and the test's images.
func (c *cluster) teardown(t *testing.T) {
	if t.Failed() {
		c.diagnose(t)
	}
	if out, err := c.run(2*time.Minute, "make", "--no-print-directory", "compose-down", "IMAGE="+c.repo,
		"COMPOSE_PROJECT="+c.project, "COMPOSE_IMAGE="+c.image, "COMPOSE_SECRETS="+c.secrets); err != nil {
		t.Errorf("make compose-down: %v\n%s", err, tail(out, 2000))
	}
	// NB: images exist only if make image got that far; a missing tag is fine.
	for _, tag := range []string{"v1", "v2", "latest"} {
		c.run(time.Minute, "docker", "image", "rm", c.repo+":"+tag)
	}
}

func (c *cluster) diagnose(t *testing.T) {
	out, _ := c.run(time.Minute, "docker-compose", "-f", c.file, "ps")
	t.Logf("docker-compose ps:\n%s", out)
	out, _ = c.run(time.Minute, "docker-compose", "-f", c.file, "logs", "--no-color", "--tail", "40")
	t.Logf("docker-compose logs (tail):\n%s", tail(out, 30000))
}

// container is a compose service's container id.
func (c *cluster) container(t *testing.T, svc string) string {
	t.Helper()
	id := strings.TrimSpace(c.compose(t, time.Minute, "ps", "-q", svc))
	if id == "" {
		t.Fatalf("no container for %s", svc)
	}
	return id
}

// health is a container's health status, or its state without one.
func (c *cluster) health(id string) string {
	out, err := c.run(30*time.Second, "docker", "inspect", "-f",
		"{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}", id)
	if err != nil {
		return "unknown: " + err.Error()
	}
	return strings.TrimSpace(out)
}

func (c *cluster) waitHealthy(t *testing.T, svc string, within time.Duration) {
	t.Helper()
	id := c.container(t, svc)
	var st string
	if !poll(within, 250*time.Millisecond, func() bool { st = c.health(id); return st == "healthy" }) {
		t.Fatalf("%s not healthy within %v: %s", svc, within, st)
	}
}

// network is the compose network's name.
func (c *cluster) network() string { return c.project + "_lodestone" }

// serverIP is a server's fixed address on the compose network.
func (c *cluster) serverIP(svc string) string {
	return c.subnet + ".1" + strings.TrimPrefix(svc, "server")
}

// consul is a Consul API client for one server's published HTTP port,
// over mutual TLS with the operator's certificate, acting with token.
func (c *cluster) consul(t *testing.T, svc, token string) *api.Client {
	t.Helper()
	ops := filepath.Join(c.secrets, "ops")
	tr := &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: 30 * time.Second,
		DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext, TLSHandshakeTimeout: 2 * time.Second}
	hc, err := api.NewHttpClient(tr, api.TLSConfig{Address: "127.0.0.1",
		CAFile: filepath.Join(ops, "ca.pem"), CertFile: filepath.Join(ops, "cert.pem"), KeyFile: filepath.Join(ops, "key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	hc.Timeout = 3 * time.Second
	cl, err := api.NewClient(&api.Config{Address: "127.0.0.1:" + c.httpPort[svc], Scheme: "https", HttpClient: hc, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// secret reads a token secret make compose-up wrote.
func (c *cluster) secret(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.secrets, "ops", name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// member is one line of `lodestone members -o json`.
type member struct {
	Name     string `json:"name"`
	PeerAddr string `json:"peer_addr"`
	GRPCAddr string `json:"grpc_addr"`
	HTTPAddr string `json:"http_addr"`
	Role     string `json:"role"`
}

// members asks a server, from inside its container (the client TLS
// variables there are the server's own pair), for the membership.
func (c *cluster) members(t *testing.T, svc string) []member {
	t.Helper()
	out := c.must(t, time.Minute, "docker", "exec", c.container(t, svc), "lodestone", "members", "--endpoints", svc+":7400", "-o", "json")
	var ms []member
	if err := json.Unmarshal([]byte(out), &ms); err != nil {
		t.Fatalf("lodestone members -o json: %v\n%s", err, out)
	}
	return ms
}

// freeSubnet picks a /24 in 172.29.0.0/16 that no Docker network uses.
func freeSubnet(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("sh", "-c", `docker network inspect -f '{{range .IPAM.Config}}{{.Subnet}} {{end}}' $(docker network ls -q)`).CombinedOutput()
	if err != nil {
		t.Fatalf("list Docker networks' subnets: %v: %s", err, out)
	}
	var used []netip.Prefix
	for _, f := range strings.Fields(string(out)) {
		if p, err := netip.ParsePrefix(f); err == nil {
			used = append(used, p)
		}
	}
	start := rand.IntN(256)
	for i := range 256 {
		third := (start + i) % 256
		p := netip.MustParsePrefix(fmt.Sprintf("172.29.%d.0/24", third))
		clash := false
		for _, u := range used {
			clash = clash || u.Overlaps(p)
		}
		if !clash {
			return "172.29." + strconv.Itoa(third)
		}
	}
	t.Fatal("every /24 of 172.29.0.0/16 is taken by a Docker network")
	return ""
}

// poll runs cond every interval until it holds (true) or within passes.
func poll(within, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(bytes.TrimSpace(b), []byte("\n"))
	return string(line)
}
