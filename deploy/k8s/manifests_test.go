package k8s

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// secretKeys are the keys make-secret.sh writes, each used by a manifest.
var secretKeys = []string{
	"acl-init-key.pem", "acl-init.pem", "ca.pem", "cluster-token", "gateway-admin-token", "gateway-key.pem",
	"gateway-token", "gateway.pem", "gossip-key", "management-token", "server-key.pem", "server.pem",
}

// runMakeSecret runs make-secret.sh with bin in a fresh directory and
// returns its stdout and stderr.
func runMakeSecret(t *testing.T, bin string, env ...string) (stdout, stderr string, err error) {
	t.Helper()
	script, err := filepath.Abs("make-secret.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", script)
	cmd.Dir = t.TempDir()
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "LODESTONE=" + bin}, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// readTexts reads every .yaml file of the directory, by name.
func readTexts(t *testing.T) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob("*.yaml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	texts := map[string][]byte{}
	for _, p := range paths {
		if texts[p], err = os.ReadFile(p); err != nil {
			t.Fatal(err)
		}
	}
	return texts
}

// loadSet decodes the manifests and adds the Secret make-secret.sh
// printed.
func loadSet(texts map[string][]byte, secretYAML string) (*manifests, error) {
	m, err := loadTexts(texts)
	if err != nil {
		return m, err
	}
	objs, err := decodeObjects("make-secret.sh", []byte(secretYAML))
	if err != nil {
		return m, err
	}
	if len(objs) != 1 || objs[0].kind != "v1/Secret" {
		return m, fmt.Errorf("make-secret.sh printed %d objects, want one Secret", len(objs))
	}
	m.objects = append(m.objects, objs...)
	return m, nil
}

// generated returns the manifests with a freshly generated Secret.
func generated(t *testing.T) (*manifests, string) {
	t.Helper()
	bin := lodestoneBinary(t)
	secretYAML, stderr, err := runMakeSecret(t, bin)
	if err != nil {
		t.Fatalf("make-secret.sh: %v\n%s", err, stderr)
	}
	m, err := loadSet(readTexts(t), secretYAML)
	if err != nil {
		t.Fatal(err)
	}
	return m, secretYAML
}

// TestManifestsDecodeStrictly: every document is an object of a known kind
// without unknown fields, and the set holds what a cluster needs (and no
// committed Secret: its keys come from make-secret.sh).
func TestManifestsDecodeStrictly(t *testing.T) {
	m, err := loadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range m.objects {
		got = append(got, o.String())
	}
	want := []string{
		"acl-init.yaml: ConfigMap lodestone-acl-policies", "acl-init.yaml: Job lodestone-acl-init",
		"gateway.yaml: Deployment lodestone-gateway", "gateway.yaml: PodDisruptionBudget lodestone-gateway", "gateway.yaml: Service lodestone-gateway",
		"namespace.yaml: Namespace lodestone",
		"server.yaml: PodDisruptionBudget lodestone", "server.yaml: Service lodestone", "server.yaml: Service lodestone-peer", "server.yaml: StatefulSet lodestone",
	}
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("objects:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if sts := m.statefulSet("lodestone"); sts == nil || sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Errorf("the StatefulSet must run 3 servers")
	}
	if d := m.deployment("lodestone-gateway"); d == nil || d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("the gateway Deployment must run 2 replicas")
	}
}

// TestManifestsAgree: what the objects say about each other holds, with
// the Secret make-secret.sh prints; every key of that Secret is used.
func TestManifestsAgree(t *testing.T) {
	m, _ := generated(t)
	for _, problem := range checkManifests(m) {
		t.Error(problem)
	}
	used := map[string]bool{}
	for _, w := range m.workloads() {
		for _, v := range w.spec.Volumes {
			if v.Secret != nil {
				for _, it := range v.Secret.Items {
					used[it.Key] = true
				}
			}
		}
		for _, c := range allContainers(w.spec) {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					used[e.ValueFrom.SecretKeyRef.Key] = true
				}
			}
		}
	}
	for _, k := range secretKeys {
		if !used[k] {
			t.Errorf("secret key %s is used by no pod", k)
		}
	}
}

// TestManifestsParseWithTheBinary: every lodestone command line is one
// the real binary accepts.
func TestManifestsParseWithTheBinary(t *testing.T) {
	m, _ := generated(t)
	for _, problem := range checkWithBinary(t, lodestoneBinary(t), m) {
		t.Error(problem)
	}
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestMakeSecret: the script's output is a strict Secret with every key,
// fresh UUID tokens, a 32-byte gossip key, and certificates from one CA
// carrying every name the manifests dial.
func TestMakeSecret(t *testing.T) {
	m, _ := generated(t)
	s := m.secret("lodestone-secrets")
	if s == nil || s.Namespace != "lodestone" {
		t.Fatalf("make-secret.sh printed no Secret lodestone-secrets in namespace lodestone")
	}
	if got := keysOf(s.Data, s.StringData); !slices.Equal(got, secretKeys) {
		t.Errorf("secret keys %v, want %v", got, secretKeys)
	}
	tokens := map[string]bool{}
	for _, k := range []string{"management-token", "gateway-token", "gateway-admin-token"} {
		v := string(s.Data[k])
		if !uuidRE.MatchString(v) || tokens[v] {
			t.Errorf("%s %q: want a fresh version 4 UUID", k, v)
		}
		tokens[v] = true
	}
	if key, err := base64.StdEncoding.DecodeString(string(s.Data["gossip-key"])); err != nil || len(key) != 32 {
		t.Errorf("gossip-key: %d bytes, %v; want base64 of 32", len(key), err)
	}
	if len(s.Data["cluster-token"]) < 16 {
		t.Errorf("cluster-token %q is too short to tell clusters apart", s.Data["cluster-token"])
	}

	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(s.Data["ca.pem"]) {
		t.Fatal("ca.pem holds no certificate")
	}
	server := verifyPair(t, s, "server", roots, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	for _, name := range dialedNames(t, m) {
		if _, err := server.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("server certificate for %s: %v", name, err)
		}
	}
	for _, client := range []string{"gateway", "acl-init"} {
		verifyPair(t, s, client, roots, x509.ExtKeyUsageClientAuth)
	}
}

// verifyPair checks that <name>.pem and <name>-key.pem match and chain to
// roots for every usage.
func verifyPair(t *testing.T, s *corev1.Secret, name string, roots *x509.CertPool, usages ...x509.ExtKeyUsage) *x509.Certificate {
	t.Helper()
	if _, err := tls.X509KeyPair(s.Data[name+".pem"], s.Data[name+"-key.pem"]); err != nil {
		t.Fatalf("%s.pem and %s-key.pem: %v", name, name, err)
	}
	block, _ := pem.Decode(s.Data[name+".pem"])
	if block == nil {
		t.Fatalf("%s.pem is not PEM", name)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s.pem: %v", name, err)
	}
	for _, u := range usages {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			t.Errorf("%s.pem for usage %v: %v", name, u, err)
		}
	}
	if left := time.Until(cert.NotAfter); left < 300*24*time.Hour {
		t.Errorf("%s.pem expires in %v", name, left.Round(time.Hour))
	}
	return cert
}

// dialedNames are the host names clients and members dial the servers at,
// as the manifests write them: --initial-cluster, the advertised
// addresses of every member, the gateway's --registry, the Job's
// LODESTONE_HTTP_ADDR, and the name every peer certificate must carry.
func dialedNames(t *testing.T, m *manifests) []string {
	t.Helper()
	names := map[string]bool{"server.lodestone": true}
	host := func(addr string) string {
		h, _, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("address %q: %v", addr, err)
		}
		return h
	}
	for _, w := range m.workloads() {
		for _, c := range allContainers(w.spec) {
			cl, ok := parseCmdline(c)
			if !ok {
				continue
			}
			switch cl.command() {
			case "server":
				for _, addr := range parseMembers(cl.flag("initial-cluster")) {
					names[host(addr)] = true
				}
				for i := range int(*w.sts.Spec.Replicas) {
					vars := map[string]string{"POD_NAME": fmt.Sprintf("%s-%d", w.obj.GetName(), i)}
					for _, f := range []string{"advertise-grpc", "advertise-http"} {
						addr, _ := expand(cl.flag(f), vars)
						names[host(addr)] = true
					}
				}
				if n := cl.flag("tls-peer-server-name"); n != "" {
					names[n] = true
				}
			case "gateway":
				for _, ep := range strings.Split(cl.flag("registry"), ",") {
					names[host(ep)] = true
				}
			}
			if v := envLiteral(c, "LODESTONE_HTTP_ADDR"); v != "" {
				u, err := url.Parse(v)
				if err != nil {
					t.Fatalf("LODESTONE_HTTP_ADDR %q: %v", v, err)
				}
				names[u.Hostname()] = true
			}
		}
	}
	out := keysOf(nil, func() map[string]string {
		s := map[string]string{}
		for n := range names {
			s[n] = ""
		}
		return s
	}())
	if len(out) < 5 { // 3 members (also their advertised names), the client Service, server.lodestone
		t.Fatalf("found only %v to check", out)
	}
	return out
}

// TestMakeSecretInputs: another namespace and size name their pods; bad
// input is refused with what is allowed and prints nothing; PKI_DIR keeps
// the CA key.
func TestMakeSecretInputs(t *testing.T) {
	bin := lodestoneBinary(t)
	out, stderr, err := runMakeSecret(t, bin, "NAMESPACE=prod", "REPLICAS=5")
	if err != nil {
		t.Fatalf("make-secret.sh: %v\n%s", err, stderr)
	}
	objs, err := decodeObjects("make-secret.sh", []byte(out))
	if err != nil || len(objs) != 1 {
		t.Fatalf("output: %d objects, %v", len(objs), err)
	}
	s := objs[0].obj.(*corev1.Secret)
	block, _ := pem.Decode(s.Data["server.pem"])
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"lodestone-4.lodestone-peer.prod.svc.cluster.local", "lodestone-4.lodestone-peer.prod.svc", "lodestone.prod.svc", "lodestone-9.lodestone-peer.prod.svc.cluster.local"} {
		if err := cert.VerifyHostname(name); err != nil {
			t.Errorf("NAMESPACE=prod REPLICAS=5: %v", err)
		}
	}
	if s.Namespace != "prod" {
		t.Errorf("namespace %q, want prod", s.Namespace)
	}

	for _, c := range []struct{ env, want string }{
		{"NAMESPACE=Prod", `NAMESPACE "Prod" is not a DNS label`},
		{"REPLICAS=0", `REPLICAS "0" is not a member count from 1 to 999`},
		{"LODESTONE=/no/such/lodestone", `no lodestone binary at "/no/such/lodestone"`},
		{"PKI_DIR=" + t.TempDir(), "exists: name a new directory"},
	} {
		out, stderr, err := runMakeSecret(t, bin, c.env)
		if code := exitCode(err); code != 2 || out != "" || !strings.Contains(stderr, c.want) {
			t.Errorf("%s: exit %d, stdout %d bytes, stderr %q; want exit 2, nothing printed, %q", c.env, code, len(out), stderr, c.want)
		}
	}

	pki := filepath.Join(t.TempDir(), "pki")
	if _, stderr, err := runMakeSecret(t, bin, "PKI_DIR="+pki); err != nil {
		t.Fatalf("PKI_DIR: %v\n%s", err, stderr)
	}
	fi, err := os.Stat(filepath.Join(pki, "lodestone-ca-key.pem"))
	if err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("PKI_DIR keeps the CA key readable by its owner only: %v %v", fi, err)
	}
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestManifestChecksBite: each check fails on a manifest broken the way it
// guards against, so a passing run means something.
func TestManifestChecksBite(t *testing.T) {
	bin := lodestoneBinary(t)
	m0, secretYAML := generated(t)
	if p := checkManifests(m0); len(p) > 0 {
		t.Fatalf("the manifests themselves fail: %v", p)
	}
	texts := readTexts(t)

	// Broken text: the decoder must refuse it.
	for _, c := range []struct{ name, file, old, new, want string }{
		{"unknown field", "server.yaml", "  podManagementPolicy: Parallel", "  podManagementPolicy: Parallel\n  replicaz: 3", `unknown field "replicaz"`},
		{"misspelt kind", "gateway.yaml", "kind: Deployment", "kind: Deploymnet", `unknown kind "apps/v1/Deploymnet"`},
		{"port not a number", "server.yaml", "containerPort: 7401", "containerPort: peer", "containerPort"},
		{"duplicate field", "acl-init.yaml", "  backoffLimit: 6", "  backoffLimit: 6\n  backoffLimit: 7", `"backoffLimit" already set`},
		{"kustomization field", "kustomization.yaml", "resources:", "resourcez:", `unknown field "resourcez"`},
	} {
		broken := copyTexts(texts)
		if !bytes.Contains(broken[c.file], []byte(c.old)) {
			t.Fatalf("%s: %s has no %q", c.name, c.file, c.old)
		}
		broken[c.file] = bytes.Replace(broken[c.file], []byte(c.old), []byte(c.new), 1)
		if _, err := loadSet(broken, secretYAML); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: decode error %v, want one containing %q", c.name, err, c.want)
		}
	}

	// Broken meaning: the decoder takes it, the checks must not.
	server := func(m *manifests) *corev1.Container {
		return &m.statefulSet("lodestone").Spec.Template.Spec.Containers[0]
	}
	gateway := func(m *manifests) *corev1.PodSpec { return &m.deployment("lodestone-gateway").Spec.Template.Spec }
	setArg := func(c *corev1.Container, flag, value string) {
		for i, a := range c.Args {
			if strings.HasPrefix(a, "--"+flag+"=") {
				c.Args[i] = "--" + flag + "=" + value
				return
			}
		}
		t.Fatalf("container %s has no --%s", c.Name, flag)
	}
	for _, c := range []struct {
		name   string
		break_ func(m *manifests)
		want   string
	}{
		{"wrong secret name", func(m *manifests) { volume(gateway(m), "tls").Secret.SecretName = "lodestone-secret" },
			`volume tls names secret "lodestone-secret", which no manifest and not make-secret.sh defines`},
		{"missing secret key", func(m *manifests) { envVar(t, server(m), "LODESTONE_GOSSIP_KEY").ValueFrom.SecretKeyRef.Key = "gossip" },
			`env LODESTONE_GOSSIP_KEY names key "gossip" of secret "lodestone-secrets"`},
		{"probe on a port nobody declares", func(m *manifests) { server(m).ReadinessProbe.HTTPGet.Port = intstr.FromString("htp") },
			`readinessProbe port "htp" is not a TCP containerPort`},
		{"probe without TLS on a TLS port", func(m *manifests) { server(m).LivenessProbe.HTTPGet.Scheme = corev1.URISchemeHTTP },
			`livenessProbe scheme "HTTP", but port 8500 speaks HTTPS`},
		{"service target port", func(m *manifests) { m.service("lodestone").Spec.Ports[0].TargetPort = intstr.FromInt32(9999) },
			`port grpc targets "9999"/, which is not a containerPort`},
		{"container port nothing listens on", func(m *manifests) { server(m).Ports[0].ContainerPort = 7500 },
			"port grpc (7500) is not a port lodestone server listens on"},
		{"listener on loopback", func(m *manifests) { setArg(server(m), "listen-http", "127.0.0.1:8500") },
			"--listen-http listens on 127.0.0.1"},
		{"selector selects nothing", func(m *manifests) {
			m.pdb("lodestone").Spec.Selector.MatchLabels["app.kubernetes.io/component"] = "servers"
		},
			"selects 0 workloads' pods"},
		{"peer service not headless", func(m *manifests) { m.service("lodestone-peer").Spec.ClusterIP = "" },
			`serviceName "lodestone-peer" is not headless`},
		{"initial cluster one short", func(m *manifests) {
			setArg(server(m), "initial-cluster", "lodestone-0=lodestone-0.lodestone-peer.lodestone.svc.cluster.local:7401,lodestone-1=lodestone-1.lodestone-peer.lodestone.svc.cluster.local:7401")
		}, "--initial-cluster lists 2 members, want replicas (3)"},
		{"initial cluster wrong namespace", func(m *manifests) {
			setArg(server(m), "initial-cluster", strings.ReplaceAll(parseFlag(server(m), "initial-cluster"), ".lodestone.svc", ".default.svc"))
		}, `--initial-cluster gives lodestone-0 the address "lodestone-0.lodestone-peer.default.svc.cluster.local:7401"`},
		{"undefined env reference", func(m *manifests) { setArg(server(m), "name", "$(POD)") }, "refers to $(POD)"},
		{"TLS file not mounted", func(m *manifests) { setArg(server(m), "tls-cert-file", "/etc/lodestone/certs/server.pem") },
			"--tls-cert-file /etc/lodestone/certs/server.pem: is not under any volume mount"},
		{"key missing from items", func(m *manifests) { setArg(server(m), "tls-key-file", "/etc/lodestone/tls/key.pem") },
			`holds [ca.pem server.pem server-key.pem], not "key.pem"`},
		{"registry service unknown", func(m *manifests) { setArg(&gateway(m).Containers[0], "registry", "lodestone.other.svc:7400") },
			"names service lodestone in namespace other"},
		{"registry on the HTTP port", func(m *manifests) { setArg(&gateway(m).Containers[0], "registry", "lodestone.lodestone.svc:8500") },
			"port 8500 of service lodestone does not reach the servers' --listen-grpc"},
		{"image differs", func(m *manifests) { gateway(m).Containers[0].Image = "lodestone:v2" }, "containers use 2 images"},
		{"writable root", func(m *manifests) { *server(m).SecurityContext.ReadOnlyRootFilesystem = false }, "readOnlyRootFilesystem: true"},
		{"root user", func(m *manifests) { *gateway(m).SecurityContext.RunAsUser = 0 }, "runAsUser: 65532"},
		{"no memory limit", func(m *manifests) { delete(server(m).Resources.Limits, corev1.ResourceMemory) }, "limit memory"},
		{"anti-affinity off", func(m *manifests) { m.statefulSet("lodestone").Spec.Template.Spec.Affinity = nil }, "no podAntiAffinity"},
		{"no grace period", func(m *manifests) { gateway(m).TerminationGracePeriodSeconds = nil }, "set terminationGracePeriodSeconds"},
		{"data dir off the claim", func(m *manifests) { setArg(server(m), "data-dir", "/tmp") }, "--data-dir \"/tmp\" must be the mount path of a volumeClaimTemplate"},
	} {
		m, err := loadSet(texts, secretYAML)
		if err != nil {
			t.Fatal(err)
		}
		c.break_(m)
		if p := checkManifests(m); !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, c.want) }) {
			t.Errorf("%s: problems %q, want one containing %q", c.name, p, c.want)
		}
	}

	// Broken command lines: the binary must refuse them.
	for _, c := range []struct {
		name   string
		break_ func(m *manifests)
		want   string
	}{
		{"unknown flag", func(m *manifests) { server(m).Args = append(server(m).Args, "--initial-clusters=x") }, "unknown flag: --initial-clusters"},
		{"bad duration", func(m *manifests) {
			init := &m.job("lodestone-acl-init").Spec.Template.Spec.InitContainers[0]
			setArg(init, "wait", "ten minutes")
		}, `invalid argument "ten minutes" for "--wait"`},
		{"unknown command", func(m *manifests) { gateway(m).Containers[0].Args[0] = "gatway" }, "lodestone gatway is not a command of the binary"},
		{"env nobody reads", func(m *manifests) {
			gateway(m).Containers[0].Env = append(gateway(m).Containers[0].Env, corev1.EnvVar{Name: "LODESTONE_REGISTRY", Value: "x"})
		}, "env LODESTONE_REGISTRY is not one lodestone gateway reads"},
	} {
		m, err := loadSet(texts, secretYAML)
		if err != nil {
			t.Fatal(err)
		}
		c.break_(m)
		if p := checkWithBinary(t, bin, m); !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, c.want) }) {
			t.Errorf("%s: problems %q, want one containing %q", c.name, p, c.want)
		}
	}
}

func copyTexts(texts map[string][]byte) map[string][]byte {
	out := map[string][]byte{}
	for k, v := range texts {
		out[k] = bytes.Clone(v)
	}
	return out
}

// envVar is the container's env entry called name.
func envVar(t *testing.T, c *corev1.Container, name string) *corev1.EnvVar {
	t.Helper()
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	t.Fatalf("container %s has no env %s", c.Name, name)
	return nil
}

// parseFlag is a container's --flag value.
func parseFlag(c *corev1.Container, flag string) string {
	cl, _ := parseCmdline(c)
	return cl.flag(flag)
}
