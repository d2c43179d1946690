package server

import (
	"os/exec"
	"strings"
	"testing"
)

// debianPython returns a python3 that imports python3-consul (Debian's
// package installs it for the system interpreter, /usr/bin/python3), or
// "" when there is none.
func debianPython() string {
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(py); err == nil && exec.Command(path, "-c", "import consul").Run() == nil {
			return path
		}
	}
	return ""
}

// Debian's python3-consul, a third-party client, drives KV, sessions and
// locks, catalog registration and health against a 3-member cluster
// through a follower. testdata/python_consul.py prints what it sees; each
// line is what Consul answers the same calls.
func TestConsulPythonClient(t *testing.T) {
	py := debianPython()
	if py == "" {
		t.Skip("python3-consul is not installed (apt-get install python3-consul; .ci/run installs it)")
	}
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	via := c.followersOf(lead)[0]
	host, port, _ := strings.Cut(c.servers[via].HTTPAddr(), ":")
	out, err := exec.Command(py, "testdata/python_consul.py", host, port).CombinedOutput()
	if err != nil {
		t.Fatalf("python_consul.py: %v\n%s", err, out)
	}
	want := []string{
		"put a/x True",
		"put a/y True",
		"get a/x 1 0 True",
		"get a/y flags 7",
		"recurse ['py/a/x', 'py/a/y']",
		"keys ['py/a/']",
		"cas on a stale index False",
		"cas on the current index True",
		"delete a/x True",
		"get deleted None",
		"delete recurse True",
		"recurse after delete None",
		"sessions created True True True",
		"s1 acquires True",
		"s2 acquires a held lock False",
		"lock holder is s1 True one 1",
		"s1 releases True",
		"s2 acquires True",
		"lock holder is s2 True 2",
		"s1 info py-one 10s release",
		"sessions listed ['py-one', 'py-two']",
		"s1 renewed True",
		"destroy s2 True",
		"delete-behavior lock after destroy None",
		"destroy s1 True",
		"s1 info after destroy None",
		"register web-1 True",
		"catalog services ['v1']",
		"catalog service [('py-node', 'pyweb-1', 8080, '10.1.0.1')]",
		"passing instances ['pyweb-1']",
		"check goes critical True",
		"passing instances []",
		"checks of pyweb [('pyweb-1-alive', 'critical')]",
		"critical checks ['pyweb-1-alive']",
		"node checks ['pyweb-1-alive']",
		"deregister node True",
		"py-node listed False",
		"leader known True",
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Errorf("line %d: got %q, want %q", i+1, g, w)
		}
	}
}
