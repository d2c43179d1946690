package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/miekg/dns"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

// instance is one record set's source: service svc<s> on node
// svc<s>-n<i>, at 10.<s>.<i>.1, port 8000+i, passing.
type instance struct {
	service, node, addr string
	port                int
}

func instances(services, per int) []instance {
	var out []instance
	for s := range services {
		for i := range per {
			out = append(out, instance{service: fmt.Sprintf("svc%d", s), node: fmt.Sprintf("svc%d-n%d", s, i),
				addr: fmt.Sprintf("10.%d.%d.1", s, i), port: 8000 + i})
		}
	}
	return out
}

// system is one DNS server under test, started and loaded with the
// records, answering on addr.
type system struct {
	name string
	addr string
	proc *harness.Proc
	// httpBase is Lodestone's HTTP base URL, for profiles; profileName
	// the file its profile goes to.
	httpBase, profileName string
}

// startLodestone runs a one-member lodestone server with DNS on its own
// port and registers the instances through the Consul HTTP API, as a
// fleet's agents would.
func startLodestone(ctx context.Context, bin, dir string, insts []instance) (*system, error) {
	ports, err := harness.FreePorts(4)
	if err != nil {
		return nil, err
	}
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	dnsAddr, httpAddr := addr(3), addr(2)
	args := []string{"server", "--name", "bench", "--data-dir", filepath.Join(dir, "data"),
		"--listen-peer", addr(0), "--listen-grpc", addr(1), "--listen-http", httpAddr, "--listen-dns", dnsAddr,
		"--log-level", "warn"}
	if *flagPprof != "" {
		args = append(args, "--enable-pprof")
	}
	p, err := harness.Start("lodestone", bin, args, filepath.Join(dir, "lodestone.log"), *flagServerCPUs)
	if err != nil {
		return nil, err
	}
	s := &system{name: "lodestone", addr: dnsAddr, proc: p, httpBase: "http://" + httpAddr}
	if err := registerAll(ctx, httpAddr, insts); err != nil {
		p.Stop(10 * time.Second)
		return nil, fmt.Errorf("lodestone: %w%s", err, harness.LogTails("lodestone", []*harness.Proc{p}, 20))
	}
	return s, nil
}

// registerAll registers every instance with a passing check, retrying
// while the server starts and elects itself.
func registerAll(ctx context.Context, httpAddr string, insts []instance) error {
	cfg := consul.DefaultConfig()
	cfg.Address = httpAddr
	cfg.HttpClient = &http.Client{Timeout: 10 * time.Second}
	c, err := consul.NewClient(cfg)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, in := range insts {
		for {
			_, err := c.Catalog().Register(&consul.CatalogRegistration{Node: in.node, Address: in.addr,
				Service: &consul.AgentService{ID: in.service, Service: in.service, Port: in.port},
				Check:   &consul.AgentCheck{CheckID: "alive", Name: "alive", ServiceID: in.service, Status: consul.HealthPassing}}, nil)
			if err == nil {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("register %s on %s: %w", in.service, in.node, errors.Join(err, ctx.Err()))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// startUnbound runs unbound with one thread and a static local zone
// holding the records Lodestone answers for the same instances: per
// service A records and SRV records whose targets <node>.node.dc1.consul
// have A records of their own.
func startUnbound(bin, dir string, insts []instance) (*system, error) {
	ports, err := harness.FreePorts(1)
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(ports[0])
	var b strings.Builder
	fmt.Fprintf(&b, `server:
	interface: 127.0.0.1
	port: %s
	do-ip4: yes
	do-ip6: no
	do-udp: yes
	do-tcp: yes
	do-daemonize: no
	chroot: ""
	username: ""
	directory: "%s"
	pidfile: "%s"
	use-syslog: no
	logfile: ""
	verbosity: 0
	num-threads: 1
	so-reuseport: no
	access-control: 127.0.0.0/8 allow
	module-config: "iterator"
	rrset-roundrobin: yes
	statistics-interval: 0
	local-zone: "consul." static
`, port, dir, filepath.Join(dir, "unbound.pid"))
	for _, in := range insts {
		name := in.service + ".service.consul."
		target := in.node + ".node.dc1.consul."
		fmt.Fprintf(&b, "\tlocal-data: \"%s 0 IN A %s\"\n", name, in.addr)
		fmt.Fprintf(&b, "\tlocal-data: \"%s 0 IN SRV 1 1 %d %s\"\n", name, in.port, target)
		fmt.Fprintf(&b, "\tlocal-data: \"%s 0 IN A %s\"\n", target, in.addr)
	}
	b.WriteString("remote-control:\n\tcontrol-enable: no\n")
	conf := filepath.Join(dir, "unbound.conf")
	if err := os.WriteFile(conf, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	p, err := harness.Start("unbound", bin, []string{"-d", "-c", conf}, filepath.Join(dir, "unbound.log"), *flagServerCPUs)
	if err != nil {
		return nil, err
	}
	return &system{name: "unbound", addr: net.JoinHostPort("127.0.0.1", port), proc: p}, nil
}

// waitAnswers waits until s answers every service's A and SRV question
// with all its instances.
func waitAnswers(ctx context.Context, s *system, services, per int) error {
	deadline := time.Now().Add(30 * time.Second)
	c := &dns.Client{Timeout: time.Second}
	for svc := range services {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeSRV} {
			name := fmt.Sprintf("svc%d.service.consul.", svc)
			for {
				m := new(dns.Msg).SetQuestion(name, qtype)
				m.SetEdns0(ednsSize, false)
				r, _, err := c.Exchange(m, s.addr)
				if err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) == per && !r.Truncated {
					break
				}
				if exited, perr := s.proc.Exited(); exited {
					return fmt.Errorf("%s exited: %v%s", s.name, perr, harness.LogTails(s.name, []*harness.Proc{s.proc}, 20))
				}
				if time.Now().After(deadline) || ctx.Err() != nil {
					return fmt.Errorf("%s never answered %s %s with %d records: %v %v%s", s.name, name, dns.TypeToString[qtype], per,
						r, errors.Join(err, ctx.Err()), harness.LogTails(s.name, []*harness.Proc{s.proc}, 20))
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	return nil
}
