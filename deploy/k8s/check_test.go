package k8s

import (
	"fmt"
	"net"
	"net/url"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// What the manifests promise, as the checks below hold them to it.
const (
	serverUID      = 65532               // the non-root user every container runs as
	clusterDomain  = "svc.cluster.local" // the cluster's DNS domain the peer names use
	hostnameTopKey = "kubernetes.io/hostname"
)

// problems collects what is wrong, each with where.
type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// checkManifests runs every check that needs no binary and returns what
// failed. The set must hold the Secret make-secret.sh prints.
func checkManifests(m *manifests) problems {
	var p problems
	ns := checkNamespace(m, &p)
	for _, o := range m.objects {
		checkMeta(o, ns, &p)
	}
	checkImages(m, &p)
	for _, w := range m.workloads() {
		where := w.String()
		if w.selector != nil {
			if sel, err := metav1.LabelSelectorAsSelector(w.selector); err != nil || !sel.Matches(labels.Set(w.labels)) {
				p.addf("%s: its selector does not select its own pod template's labels %v", where, w.labels)
			}
		}
		checkPodSecurity(w, &p)
		if w.kind != "batch/v1/Job" && w.spec.TerminationGracePeriodSeconds == nil {
			p.addf("%s: set terminationGracePeriodSeconds: how long a stopping process may finish", where)
		}
		checkReferences(m, w, &p)
		for _, c := range allContainers(w.spec) {
			cw := fmt.Sprintf("%s container %s", where, c.Name)
			checkContainer(m, w, c, cw, &p)
		}
	}
	checkServices(m, &p)
	checkPDBs(m, &p)
	for _, w := range m.workloads() {
		if w.sts != nil {
			checkStatefulSet(m, w, ns, &p)
		}
	}
	return p
}

func checkNamespace(m *manifests, p *problems) string {
	var names []string
	for _, o := range m.objects {
		if o.kind == "v1/Namespace" {
			names = append(names, o.obj.GetName())
		}
	}
	if len(names) != 1 {
		p.addf("want exactly one Namespace, found %v", names)
		return ""
	}
	return names[0]
}

func checkMeta(o object, ns string, p *problems) {
	if o.kind != "v1/Namespace" && o.obj.GetNamespace() != ns {
		p.addf("%s: namespace %q, want %q (the names the pods dial spell it out)", o, o.obj.GetNamespace(), ns)
	}
	valid := validation.IsDNS1123Subdomain
	if o.kind == "v1/Service" || o.kind == "v1/Namespace" {
		valid = validation.IsDNS1123Label
	}
	for _, msg := range valid(o.obj.GetName()) {
		p.addf("%s: name: %s", o, msg)
	}
	for k, v := range o.obj.GetLabels() {
		for _, msg := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
			p.addf("%s: label %s=%s: %s", o, k, v, msg)
		}
	}
}

// checkImages: one image everywhere, and it is the one kustomization.yaml
// lets the operator replace; kustomization.yaml lists every manifest.
func checkImages(m *manifests, p *problems) {
	images := map[string][]string{}
	for _, w := range m.workloads() {
		for _, c := range allContainers(w.spec) {
			images[c.Image] = append(images[c.Image], w.String()+" container "+c.Name)
		}
	}
	if len(images) != 1 {
		p.addf("containers use %d images, want one: %v", len(images), images)
	}
	if m.kust == nil {
		p.addf("kustomization.yaml is missing")
		return
	}
	if !slices.Equal(sortedCopy(m.kust.Resources), m.files) {
		p.addf("kustomization.yaml resources %v, want every manifest file %v", m.kust.Resources, m.files)
	}
	for image := range images {
		name, _, _ := strings.Cut(image, ":")
		if len(m.kust.Images) != 1 || m.kust.Images[0].Name != name {
			p.addf("image %q: kustomization.yaml images must name %q once, so kustomize can set it", image, name)
		}
	}
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	sort.Strings(c)
	return c
}

// checkPodSecurity holds every pod to the restricted Pod Security
// Standard and the resources a scheduler needs.
func checkPodSecurity(w workload, p *problems) {
	where := w.String()
	sc := w.spec.SecurityContext
	switch {
	case sc == nil:
		p.addf("%s: no pod securityContext", where)
	default:
		if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != serverUID {
			p.addf("%s: pod must set runAsNonRoot: true and runAsUser: %d", where, serverUID)
		}
		if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			p.addf("%s: pod seccompProfile must be RuntimeDefault", where)
		}
	}
	if w.spec.AutomountServiceAccountToken == nil || *w.spec.AutomountServiceAccountToken {
		p.addf("%s: automountServiceAccountToken must be false: nothing here talks to the API server", where)
	}
	if w.spec.HostNetwork || w.spec.HostPID || w.spec.HostIPC {
		p.addf("%s: uses the host's namespaces", where)
	}
	for _, v := range w.spec.Volumes {
		if v.HostPath != nil {
			p.addf("%s: volume %s is a hostPath", where, v.Name)
		}
	}
	for _, c := range allContainers(w.spec) {
		cw := where + " container " + c.Name
		cs := c.SecurityContext
		if cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation ||
			cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem ||
			cs.Capabilities == nil || !slices.Contains(cs.Capabilities.Drop, "ALL") || len(cs.Capabilities.Add) > 0 ||
			(cs.Privileged != nil && *cs.Privileged) {
			p.addf("%s: securityContext must set allowPrivilegeEscalation: false, readOnlyRootFilesystem: true and drop ALL capabilities", cw)
		}
		req, lim := c.Resources.Requests, c.Resources.Limits
		if req.Cpu().IsZero() || req.Memory().IsZero() || lim.Memory().IsZero() {
			p.addf("%s: resources must request cpu and memory and limit memory", cw)
		} else if lim.Memory().Cmp(*req.Memory()) < 0 {
			p.addf("%s: memory limit %s is below its request %s", cw, lim.Memory(), req.Memory())
		}
	}
}

// checkReferences: every Secret, ConfigMap and key a pod names exists in
// the set, and every volume mount names a volume.
func checkReferences(m *manifests, w workload, p *problems) {
	where := w.String()
	needKey := func(what, kind, name, key string) {
		switch kind {
		case "Secret":
			if s := m.secret(name); s == nil {
				p.addf("%s: %s names secret %q, which no manifest and not make-secret.sh defines", where, what, name)
			} else if key != "" && !secretHas(s, key) {
				p.addf("%s: %s names key %q of secret %q, which it lacks", where, what, key, name)
			}
		case "ConfigMap":
			if cm := m.configMap(name); cm == nil {
				p.addf("%s: %s names configMap %q, which no manifest defines", where, what, name)
			} else if _, ok := cm.Data[key]; key != "" && !ok {
				p.addf("%s: %s names key %q of configMap %q, which it lacks", where, what, key, name)
			}
		}
	}
	for _, v := range w.spec.Volumes {
		what := "volume " + v.Name
		switch {
		case v.Secret != nil:
			needKey(what, "Secret", v.Secret.SecretName, "")
			for _, it := range v.Secret.Items {
				needKey(what, "Secret", v.Secret.SecretName, it.Key)
			}
		case v.ConfigMap != nil:
			needKey(what, "ConfigMap", v.ConfigMap.Name, "")
			for _, it := range v.ConfigMap.Items {
				needKey(what, "ConfigMap", v.ConfigMap.Name, it.Key)
			}
		case v.Projected != nil:
			p.addf("%s: %s is projected, which these checks do not follow", where, what)
		}
	}
	claims := map[string]bool{}
	if w.sts != nil {
		for _, t := range w.sts.Spec.VolumeClaimTemplates {
			claims[t.Name] = true
		}
	}
	for _, c := range allContainers(w.spec) {
		for _, e := range c.Env {
			what := "container " + c.Name + " env " + e.Name
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil && (r.Optional == nil || !*r.Optional) {
				needKey(what, "Secret", r.Name, r.Key)
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil && (r.Optional == nil || !*r.Optional) {
				needKey(what, "ConfigMap", r.Name, r.Key)
			}
		}
		for _, ef := range c.EnvFrom {
			if ef.SecretRef != nil {
				needKey("container "+c.Name+" envFrom", "Secret", ef.SecretRef.Name, "")
			}
			if ef.ConfigMapRef != nil {
				needKey("container "+c.Name+" envFrom", "ConfigMap", ef.ConfigMapRef.Name, "")
			}
		}
		for _, vm := range c.VolumeMounts {
			if volume(w.spec, vm.Name) == nil && !claims[vm.Name] {
				p.addf("%s: container %s mounts %q, which is neither a volume nor a claim template", where, c.Name, vm.Name)
			}
		}
	}
}

func volume(spec *corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// listener is an address a lodestone command listens on, given by a flag.
type listener struct {
	flag     string
	fallback string   // the flag's default
	tlsFlags []string // any of these set: the listener speaks TLS
	udp      bool     // it also listens on UDP (gossip)
}

// listeners are the listening flags of each long-running command.
var listeners = map[string][]listener{
	"server": {
		{flag: "listen-grpc", fallback: "127.0.0.1:7400", tlsFlags: []string{"tls-cert-file"}},
		{flag: "listen-peer", fallback: "127.0.0.1:7401", tlsFlags: []string{"tls-cert-file"}},
		{flag: "listen-http", fallback: "127.0.0.1:8500", tlsFlags: []string{"tls-cert-file"}},
		{flag: "gossip-listen", udp: true},
	},
	"gateway": {
		{flag: "listen", fallback: "127.0.0.1:8080", tlsFlags: []string{"tls-cert", "tls-cert-dir"}},
		{flag: "admin", fallback: "127.0.0.1:8081", tlsFlags: []string{"admin-tls-cert-file"}},
	},
}

// listenerOn finds the listener of cl on port; tls reports whether it
// speaks TLS.
func listenerOn(cl *cmdline, port int32) (l listener, host string, tls, ok bool) {
	for _, l := range listeners[cl.command()] {
		addr := cl.flag(l.flag)
		if addr == "" {
			addr = l.fallback
		}
		h, ps, err := net.SplitHostPort(addr)
		if err != nil {
			continue
		}
		if n, _ := strconv.Atoi(ps); int32(n) == port {
			return l, h, slices.ContainsFunc(l.tlsFlags, cl.has), true
		}
	}
	return listener{}, "", false, false
}

// checkContainer: ports, probes, file references and the command line of
// one container.
func checkContainer(m *manifests, w workload, c *corev1.Container, where string, p *problems) {
	cl, ok := parseCmdline(c)
	if !ok {
		p.addf("%s: command %v, want [lodestone] (the image's binary, with the subcommand in args)", where, c.Command)
		return
	}
	vars := map[string]string{}
	for _, e := range c.Env {
		vars[e.Name] = "x"
	}
	for _, a := range c.Args {
		if _, missing := expand(a, vars); len(missing) > 0 {
			p.addf("%s: arg %q refers to $(%s), which the container's env does not define", where, a, strings.Join(missing, "), $("))
		}
	}
	checkPorts(c, cl, where, p)
	checkProbes(w, c, cl, where, p)
	checkFiles(m, w, c, cl, where, p)
	switch cl.command() {
	case "gateway":
		for _, ep := range strings.Split(cl.flag("registry"), ",") {
			checkClientAddr(m, "--registry "+ep, ep, "listen-grpc", where, p)
		}
	}
	if v := envLiteral(c, "LODESTONE_HTTP_ADDR"); v != "" {
		u, err := url.Parse(v)
		if err != nil || u.Scheme != "https" {
			p.addf("%s: LODESTONE_HTTP_ADDR %q: want https://host:port, the servers' HTTP port speaks TLS", where, v)
		} else {
			checkClientAddr(m, "LODESTONE_HTTP_ADDR", u.Host, "listen-http", where, p)
		}
	}
}

func envLiteral(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom == nil {
			return e.Value
		}
	}
	return ""
}

// checkPorts: every declared container port is one the process listens
// on, on every interface.
func checkPorts(c *corev1.Container, cl *cmdline, where string, p *problems) {
	if len(c.Ports) > 0 && len(listeners[cl.command()]) == 0 {
		p.addf("%s: declares ports, but lodestone %s listens on none", where, cl.command())
	}
	for _, cp := range c.Ports {
		if len(listeners[cl.command()]) == 0 {
			break
		}
		l, host, _, ok := listenerOn(cl, cp.ContainerPort)
		switch {
		case !ok:
			p.addf("%s: port %s (%d) is not a port lodestone %s listens on", where, cp.Name, cp.ContainerPort, cl.command())
		case host != "0.0.0.0" && host != "::" && host != "":
			p.addf("%s: port %s: --%s listens on %s, which other pods and the kubelet cannot reach", where, cp.Name, l.flag, host)
		case cp.Protocol == corev1.ProtocolUDP && !l.udp:
			p.addf("%s: port %s is UDP, but --%s is TCP only", where, cp.Name, l.flag)
		}
	}
}

// containerPort resolves a port given by name or number among c's ports.
func containerPort(c *corev1.Container, port intstr.IntOrString, proto corev1.Protocol) (int32, bool) {
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, cp := range c.Ports {
		pp := cp.Protocol
		if pp == "" {
			pp = corev1.ProtocolTCP
		}
		if pp != proto {
			continue
		}
		if port.Type == intstr.String && cp.Name == port.StrVal || port.Type == intstr.Int && cp.ContainerPort == port.IntVal {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// checkProbes: long-running containers have readiness and liveness probes
// on /readyz and /healthz of a port they serve, with the scheme it speaks.
func checkProbes(w workload, c *corev1.Container, cl *cmdline, where string, p *problems) {
	longRunning := w.kind != "batch/v1/Job"
	if longRunning && (c.ReadinessProbe == nil || c.LivenessProbe == nil) {
		p.addf("%s: needs a readinessProbe and a livenessProbe", where)
	}
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}, {"startupProbe", c.StartupProbe, "/healthz"}} {
		if pr.probe == nil {
			continue
		}
		g := pr.probe.HTTPGet
		if g == nil {
			p.addf("%s: %s is not an httpGet", where, pr.name)
			continue
		}
		if g.Path != pr.path {
			p.addf("%s: %s path %q, want %s", where, pr.name, g.Path, pr.path)
		}
		port, ok := containerPort(c, g.Port, corev1.ProtocolTCP)
		if !ok {
			p.addf("%s: %s port %q is not a TCP containerPort of the container", where, pr.name, g.Port.String())
			continue
		}
		_, _, tls, ok := listenerOn(cl, port)
		if !ok {
			p.addf("%s: %s port %d is not a port the process listens on", where, pr.name, port)
			continue
		}
		if want := map[bool]corev1.URIScheme{true: corev1.URISchemeHTTPS, false: corev1.URISchemeHTTP}[tls]; g.Scheme != want && !(g.Scheme == "" && want == corev1.URISchemeHTTP) {
			p.addf("%s: %s scheme %q, but port %d speaks %s", where, pr.name, g.Scheme, port, want)
		}
	}
}

// checkClientAddr: addr (host:port) is a client Service of the servers in
// the manifests' namespace, on the port that reaches listenFlag.
func checkClientAddr(m *manifests, what, addr, listenFlag, where string, p *problems) {
	host, ps, err := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(ps)
	if err != nil {
		p.addf("%s: %s %q is not host:port", where, what, addr)
		return
	}
	labelsOf := strings.Split(host, ".")
	if len(labelsOf) != 3 || labelsOf[2] != "svc" {
		p.addf("%s: %s host %q: want <service>.<namespace>.svc", where, what, host)
		return
	}
	svc := m.service(labelsOf[0])
	if svc == nil || svc.Namespace != labelsOf[1] {
		p.addf("%s: %s names service %s in namespace %s, which no manifest defines", where, what, labelsOf[0], labelsOf[1])
		return
	}
	for _, sp := range svc.Spec.Ports {
		if sp.Port != int32(port) {
			continue
		}
		for _, w := range selectedBy(m, svc.Spec.Selector) {
			for _, c := range allContainers(w.spec) {
				cl, ok := parseCmdline(c)
				if !ok || cl.command() != "server" {
					continue
				}
				target, ok := containerPort(c, targetOf(sp), sp.Protocol)
				if l, _, _, on := listenerOn(cl, target); ok && on && l.flag == listenFlag {
					return
				}
			}
		}
	}
	p.addf("%s: %s: port %d of service %s does not reach the servers' --%s", where, what, port, svc.Name, listenFlag)
}

func targetOf(sp corev1.ServicePort) intstr.IntOrString {
	if sp.TargetPort.Type == intstr.Int && sp.TargetPort.IntVal == 0 {
		return intstr.FromInt32(sp.Port)
	}
	return sp.TargetPort
}

// selectedBy is every workload whose pods carry sel's labels.
func selectedBy(m *manifests, sel map[string]string) []workload {
	var out []workload
	if len(sel) == 0 {
		return nil
	}
	s := labels.SelectorFromSet(sel)
	for _, w := range m.workloads() {
		if s.Matches(labels.Set(w.labels)) {
			out = append(out, w)
		}
	}
	return out
}

// fileFlags are flags whose value is a file the process reads; secret
// ones must come from a Secret.
var fileFlags = map[string]bool{
	"tls-ca-file": true, "tls-cert-file": true, "tls-key-file": true, "tls-peer-cert-file": true, "tls-peer-key-file": true,
	"ca-file": true, "cert-file": true, "key-file": true, "token-file": true, "admin-token-file": true,
	"admin-tls-ca-file": true, "admin-tls-cert-file": true, "admin-tls-key-file": true, "secret-file": true,
	"routes": false, "rules": false,
}

// fileEnv are env vars whose value is a file the CLI reads.
var fileEnv = map[string]bool{
	"LODESTONE_CACERT": true, "LODESTONE_CLIENT_CERT": true, "LODESTONE_CLIENT_KEY": true, "LODESTONE_TOKEN_FILE": true,
}

// checkFiles: every file a container reads is a key of a Secret or
// ConfigMap mounted there (the root filesystem is read-only and holds
// none), TLS material and tokens from a Secret; the data and state
// directories are writable volumes.
func checkFiles(m *manifests, w workload, c *corev1.Container, cl *cmdline, where string, p *problems) {
	check := func(what, file string, secret bool) {
		kind, err := mountedFile(m, w, c, file)
		switch {
		case err != nil:
			p.addf("%s: %s %s: %v", where, what, file, err)
		case secret && kind != "Secret":
			p.addf("%s: %s %s comes from a %s, want a Secret", where, what, file, kind)
		}
	}
	for name, secret := range fileFlags {
		for _, v := range cl.flags[name] {
			check("--"+name, strings.TrimPrefix(v, "@"), secret)
		}
	}
	for _, e := range c.Env {
		if fileEnv[e.Name] {
			check(e.Name, e.Value, true)
		}
	}
	for _, a := range cl.positional {
		if path.IsAbs(a) {
			check("argument", a, true)
		}
	}
	if d := cl.flag("data-dir"); cl.command() == "server" {
		if vm := mountOf(c, d); vm == nil || vm.MountPath != d || w.sts == nil || !slices.ContainsFunc(w.sts.Spec.VolumeClaimTemplates, func(t corev1.PersistentVolumeClaim) bool { return t.Name == vm.Name }) {
			p.addf("%s: --data-dir %q must be the mount path of a volumeClaimTemplate", where, d)
		}
	}
	if d := cl.flag("state-dir"); d != "" {
		if vm := mountOf(c, d); vm == nil || vm.ReadOnly || volume(w.spec, vm.Name) == nil || volume(w.spec, vm.Name).EmptyDir == nil && volume(w.spec, vm.Name).PersistentVolumeClaim == nil {
			p.addf("%s: --state-dir %q must be on a writable emptyDir or claim", where, d)
		}
	}
}

// mountOf is the mount of c that holds file (the longest mount path).
func mountOf(c *corev1.Container, file string) *corev1.VolumeMount {
	var best *corev1.VolumeMount
	for i, vm := range c.VolumeMounts {
		if (file == vm.MountPath || strings.HasPrefix(file, strings.TrimSuffix(vm.MountPath, "/")+"/")) &&
			(best == nil || len(vm.MountPath) > len(best.MountPath)) {
			best = &c.VolumeMounts[i]
		}
	}
	return best
}

// mountedFile finds the Secret or ConfigMap key file is, and returns that
// volume's kind.
func mountedFile(m *manifests, w workload, c *corev1.Container, file string) (string, error) {
	vm := mountOf(c, file)
	if vm == nil {
		return "", fmt.Errorf("is not under any volume mount of the container")
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(file, vm.MountPath), "/")
	if vm.SubPath != "" {
		if rel != "" {
			return "", fmt.Errorf("is under a subPath mount of one file")
		}
		rel = vm.SubPath
	}
	v := volume(w.spec, vm.Name)
	if v == nil {
		return "", fmt.Errorf("is on %s, which is not a volume of the pod", vm.Name)
	}
	var keys []string
	var kind string
	switch {
	case v.Secret != nil:
		kind = "Secret"
		keys = itemPaths(v.Secret.Items)
		if len(keys) == 0 {
			if s := m.secret(v.Secret.SecretName); s != nil {
				keys = keysOf(s.Data, s.StringData)
			}
		}
	case v.ConfigMap != nil:
		kind = "ConfigMap"
		keys = itemPaths(v.ConfigMap.Items)
		if len(keys) == 0 {
			if cm := m.configMap(v.ConfigMap.Name); cm != nil {
				keys = keysOf(nil, cm.Data)
			}
		}
	default:
		return "", fmt.Errorf("is on volume %s, which is neither a Secret nor a ConfigMap", v.Name)
	}
	if !slices.Contains(keys, rel) {
		return "", fmt.Errorf("volume %s (%s) holds %v, not %q", v.Name, kind, keys, rel)
	}
	return kind, nil
}

func itemPaths(items []corev1.KeyToPath) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.Path)
	}
	return out
}

func keysOf(data map[string][]byte, strs map[string]string) []string {
	var out []string
	for k := range data {
		out = append(out, k)
	}
	for k := range strs {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkServices: each Service selects exactly one workload's pods, and each
// of its target ports is a port of those pods.
func checkServices(m *manifests, p *problems) {
	for _, o := range m.objects {
		svc, ok := o.obj.(*corev1.Service)
		if !ok {
			continue
		}
		ws := selectedBy(m, svc.Spec.Selector)
		if len(ws) != 1 {
			p.addf("%s: selector %v selects %d workloads' pods, want exactly 1", o, svc.Spec.Selector, len(ws))
			continue
		}
		for _, sp := range svc.Spec.Ports {
			found := false
			for _, c := range allContainers(ws[0].spec) {
				if _, ok := containerPort(c, targetOf(sp), sp.Protocol); ok {
					found = true
				}
			}
			if target := targetOf(sp); !found {
				p.addf("%s: port %s targets %q/%s, which is not a containerPort of %s", o, sp.Name, target.String(), sp.Protocol, ws[0])
			}
		}
	}
}

// checkPDBs: each budget selects exactly one workload's pods; the servers
// have one that lets one member go at a time.
func checkPDBs(m *manifests, p *problems) {
	covered := map[string]bool{}
	for _, o := range m.objects {
		b, ok := o.obj.(*policyv1.PodDisruptionBudget)
		if !ok {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil || b.Spec.Selector == nil || sel.Empty() {
			p.addf("%s: selector %v is empty or invalid", o, b.Spec.Selector)
			continue
		}
		var hits []workload
		for _, w := range m.workloads() {
			if sel.Matches(labels.Set(w.labels)) {
				hits = append(hits, w)
			}
		}
		if len(hits) != 1 {
			p.addf("%s: selector %v selects %d workloads' pods, want exactly 1", o, b.Spec.Selector.MatchLabels, len(hits))
			continue
		}
		if b.Spec.MaxUnavailable == nil || b.Spec.MaxUnavailable.String() != "1" {
			p.addf("%s: maxUnavailable %v, want 1", o, b.Spec.MaxUnavailable)
		}
		covered[hits[0].String()] = true
	}
	for _, w := range m.workloads() {
		if w.sts != nil && !covered[w.String()] {
			p.addf("%s: no PodDisruptionBudget selects its pods", w)
		}
	}
}

// checkStatefulSet: the peer Service, the member list, the advertised
// addresses, the data volume and the spread over nodes agree.
func checkStatefulSet(m *manifests, w workload, ns string, p *problems) {
	sts := w.sts
	where := w.String()
	svc := m.service(sts.Spec.ServiceName)
	switch {
	case svc == nil:
		p.addf("%s: serviceName %q names no Service", where, sts.Spec.ServiceName)
		return
	case svc.Spec.ClusterIP != corev1.ClusterIPNone:
		p.addf("%s: serviceName %q is not headless (clusterIP: None)", where, svc.Name)
	case !svc.Spec.PublishNotReadyAddresses:
		p.addf("%s: service %s must set publishNotReadyAddresses: members resolve each other before any is ready", where, svc.Name)
	}
	if len(selectedBy(m, svc.Spec.Selector)) != 1 || selectedBy(m, svc.Spec.Selector)[0].String() != where {
		p.addf("%s: service %s does not select its pods", where, svc.Name)
	}
	if sts.Spec.PodManagementPolicy != "Parallel" {
		p.addf("%s: podManagementPolicy must be Parallel: no member is ready before a quorum starts", where)
	}
	checkAntiAffinity(w, p)
	replicas := int32(1)
	if sts.Spec.Replicas != nil {
		replicas = *sts.Spec.Replicas
	}
	suffix := "." + svc.Name + "." + ns + "." + clusterDomain
	for _, c := range allContainers(w.spec) {
		cl, ok := parseCmdline(c)
		if !ok || cl.command() != "server" {
			continue
		}
		cw := where + " container " + c.Name
		checkPodNameEnv(c, cl, cw, p)
		members := parseMembers(cl.flag("initial-cluster"))
		if len(members) != int(replicas) {
			p.addf("%s: --initial-cluster lists %d members, want replicas (%d)", cw, len(members), replicas)
		}
		peerPort := portOf(cl.flag("listen-peer"))
		var hosts []string
		for i := range int(replicas) {
			name := fmt.Sprintf("%s-%d", sts.Name, i)
			host := name + suffix
			hosts = append(hosts, host)
			if got, want := members[name], net.JoinHostPort(host, peerPort); got != want {
				p.addf("%s: --initial-cluster gives %s the address %q, want %q", cw, name, got, want)
			}
		}
		for flag, listen := range map[string]string{"advertise-grpc": "listen-grpc", "advertise-http": "listen-http"} {
			if got, want := cl.flag(flag), "$(POD_NAME)"+suffix+":"+portOf(cl.flag(listen)); got != want {
				p.addf("%s: --%s %q, want %q", cw, flag, got, want)
			}
		}
		var join []string
		for _, h := range hosts {
			join = append(join, net.JoinHostPort(h, portOf(cl.flag("gossip-listen"))))
		}
		if got := cl.flag("gossip-join"); got != strings.Join(join, ",") {
			p.addf("%s: --gossip-join %q, want every member %q", cw, got, strings.Join(join, ","))
		}
	}
}

func checkAntiAffinity(w workload, p *problems) {
	a := w.spec.Affinity
	if a == nil || a.PodAntiAffinity == nil {
		p.addf("%s: no podAntiAffinity: two members on one node fall together", w)
		return
	}
	for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if err == nil && term.TopologyKey == hostnameTopKey && !sel.Empty() && sel.Matches(labels.Set(w.labels)) {
			return
		}
	}
	p.addf("%s: podAntiAffinity must require its pods on distinct %s", w, hostnameTopKey)
}

// checkPodNameEnv: --name is the pod's name, from the downward API.
func checkPodNameEnv(c *corev1.Container, cl *cmdline, where string, p *problems) {
	if cl.flag("name") != "$(POD_NAME)" {
		p.addf("%s: --name %q, want $(POD_NAME): a member's name is its pod's", where, cl.flag("name"))
	}
	for _, e := range c.Env {
		if e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
			return
		}
	}
	p.addf("%s: env POD_NAME must come from fieldRef metadata.name", where)
}

// parseMembers splits --initial-cluster's name=host:port list.
func parseMembers(s string) map[string]string {
	out := map[string]string{}
	for _, part := range strings.Split(s, ",") {
		if name, addr, ok := strings.Cut(part, "="); ok {
			out[name] = addr
		}
	}
	return out
}

func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}
