package server

import (
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"

	consul "github.com/hashicorp/consul/api"
)

// dig, the resolver operators use (Debian's bind9-dnsutils, which .ci/run
// installs), asks a running server exactly as the acceptance line
// does, and its answer section lists the passing instances of web with
// their ports, and nothing else.
func TestDigListsPassingInstances(t *testing.T) {
	dig, err := exec.LookPath("dig")
	if err != nil {
		t.Skip("dig not installed (Debian: apt-get install bind9-dnsutils; .ci/run installs it)")
	}
	c := newTestCluster(t, 1, withDNS(nil))
	s := c.servers[c.waitLeader()]
	cl := consulClient(t, c, s.cfg.Name)
	want := map[string]bool{}
	for i, st := range []string{consul.HealthPassing, consul.HealthPassing, consul.HealthPassing, consul.HealthCritical} {
		node, port := fmt.Sprintf("web-%d", i), 8000+i
		_, err := cl.Catalog().Register(&consul.CatalogRegistration{Node: node, Address: fmt.Sprintf("10.0.0.%d", i+1),
			Service: &consul.AgentService{ID: "web", Service: "web", Port: port},
			Check:   &consul.AgentCheck{CheckID: "web-check", Name: "web", ServiceID: "web", Status: st}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st == consul.HealthPassing {
			want[fmt.Sprintf("%s.node.dc1.consul.:%d", node, port)] = true
		}
	}
	// An instance of another service and a critical one must not show.
	if _, err := cl.Catalog().Register(&consul.CatalogRegistration{Node: "db-0", Address: "10.0.1.1",
		Service: &consul.AgentService{ID: "db", Service: "db", Port: 5432}}, nil); err != nil {
		t.Fatal(err)
	}

	host, port, _ := net.SplitHostPort(s.DNSAddr())
	out, err := exec.Command(dig, "@"+host, "-p", port, "web.service.consul", "SRV").CombinedOutput()
	if err != nil {
		t.Fatalf("dig: %v\n%s", err, out)
	}
	got, extra, status := parseDig(t, string(out))
	if status != "NOERROR" {
		t.Fatalf("dig status %s, want NOERROR\n%s", status, out)
	}
	if len(got) != len(want) {
		t.Fatalf("dig listed %v, want exactly %v\n%s", got, want, out)
	}
	for _, g := range got {
		if !want[g] {
			t.Fatalf("dig listed %v, want exactly %v\n%s", got, want, out)
		}
	}
	// Every target's address is in the additional section.
	for _, g := range got {
		target := g[:strings.LastIndex(g, ":")]
		if !slices.Contains(extra, target) {
			t.Fatalf("dig's additional section %v lacks %s\n%s", extra, target, out)
		}
	}

	// A name that does not exist is NXDOMAIN, as dig reports it.
	out, err = exec.Command(dig, "@"+host, "-p", port, "nosuch.service.consul", "SRV").CombinedOutput()
	if err != nil {
		t.Fatalf("dig: %v\n%s", err, out)
	}
	if _, _, status := parseDig(t, string(out)); status != "NXDOMAIN" {
		t.Fatalf("dig status %s for an unknown service, want NXDOMAIN\n%s", status, out)
	}
}

// parseDig reads dig's default output: the status from the header line,
// "target:port" for each SRV in the answer section, and the owner names
// of the A records in the additional section.
func parseDig(t *testing.T, out string) (srv, extra []string, status string) {
	t.Helper()
	section := ""
	for _, line := range strings.Split(out, "\n") {
		if i := strings.Index(line, "status: "); i >= 0 {
			status = strings.TrimSuffix(strings.Fields(line[i+len("status: "):])[0], ",")
		}
		switch {
		case strings.HasPrefix(line, ";; ANSWER SECTION:"):
			section = "answer"
			continue
		case strings.HasPrefix(line, ";; ADDITIONAL SECTION:"):
			section = "additional"
			continue
		case strings.HasPrefix(line, ";;") || strings.TrimSpace(line) == "":
			section = ""
			continue
		}
		f := strings.Fields(line)
		switch {
		case section == "answer" && len(f) == 8 && f[3] == "SRV":
			srv = append(srv, f[7]+":"+f[6])
		case section == "answer":
			t.Fatalf("dig answer line %q is not an SRV record", line)
		case section == "additional" && len(f) == 5 && f[3] == "A":
			extra = append(extra, f[0])
		}
	}
	return srv, extra, status
}
