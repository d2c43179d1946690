// Command etcdnode runs one etcd member in-process (go.etcd.io/etcd/server/v3/embed)
// so bench/ can start a real three-process etcd cluster without an etcd
// binary on the machine. Its flags mirror `lodestone server` so the two
// clusters are started the same way:
//
//	etcdnode --name n1 --data-dir D --listen-peer 127.0.0.1:P --listen-client 127.0.0.1:C \
//	    --initial-cluster n1=127.0.0.1:P1,n2=127.0.0.1:P2,n3=127.0.0.1:P3
//
// Addresses may be host:port or URLs (http:// is assumed, https:// with TLS).
// fsync is on, as in a default etcd; --unsafe-no-fsync exists only to make
// that explicit.
//
// --tls-ca-file, --tls-cert-file and --tls-key-file (named as `lodestone
// server` names them) turn on TLS on the client and peer ports with the same
// certificate, as a Lodestone server uses its one certificate on every port;
// the peer port then always requires a client certificate from the CA, and
// --tls-verify-incoming requires one on the client port too (etcd's
// --client-cert-auth and --peer-client-cert-auth). --listen-client-http
// moves etcd's HTTP endpoints (JSON gateway, /health, /metrics) to a port of
// their own, so the client port serves gRPC only, natively: with TLS on a
// shared port etcd serves gRPC through net/http's HTTP/2 server instead
// (embed/serve.go), and etcd recommends the split (--listen-client-http-urls).
// Its Go heap grows to --gc-heap-floor-mib before a collection, with the
// same default and code as a Lodestone server's, so the two spend GC work
// alike and a comparison shows their designs, not that setting.
// It logs errors only, and stops cleanly on SIGTERM or SIGINT.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/lodestone-kv/lodestone/internal/heapfloor"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "etcdnode: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("etcdnode", flag.ContinueOnError)
	name := fs.String("name", "", "member name (required)")
	dataDir := fs.String("data-dir", "", "data directory (required)")
	peer := fs.String("listen-peer", "", "peer address, host:port or URL (required)")
	client := fs.String("listen-client", "", "client (gRPC) address, host:port or URL (required)")
	initial := fs.String("initial-cluster", "", "name=peeraddr,... for every member (required)")
	token := fs.String("initial-cluster-token", "etcdnode-bench", "cluster token")
	noFsync := fs.Bool("unsafe-no-fsync", false, "disable fsync (never used by the benchmarks)")
	logLevel := fs.String("log-level", "error", "debug, info, warn or error")
	enablePprof := fs.Bool("enable-pprof", false, "serve Go's profiler under /debug/pprof/ on the client URL")
	caFile := fs.String("tls-ca-file", "", "CA bundle that verifies client and peer certificates")
	certFile := fs.String("tls-cert-file", "", "certificate served on the client and peer ports (and presented to peers); turns TLS on")
	keyFile := fs.String("tls-key-file", "", "key of --tls-cert-file")
	verifyIncoming := fs.Bool("tls-verify-incoming", false, "require a client certificate from --tls-ca-file on the client port (the peer port always requires one with TLS)")
	clientHTTP := fs.String("listen-client-http", "", "serve etcd's HTTP endpoints here instead of on --listen-client, which then serves gRPC only")
	heapFloorMiB := fs.Uint64("gc-heap-floor-mib", 256, "let the Go heap grow to this many MiB before a garbage collection (0: GOGC alone), as lodestone server does")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" || *dataDir == "" || *peer == "" || *client == "" || *initial == "" {
		return fmt.Errorf("--name, --data-dir, --listen-peer, --listen-client and --initial-cluster are required")
	}
	secure := *certFile != "" || *keyFile != ""
	if secure && (*certFile == "" || *keyFile == "" || *caFile == "") {
		return fmt.Errorf("TLS needs --tls-ca-file, --tls-cert-file and --tls-key-file together")
	}
	if !secure && (*caFile != "" || *verifyIncoming) {
		return fmt.Errorf("--tls-ca-file and --tls-verify-incoming need --tls-cert-file and --tls-key-file")
	}
	toURL := func(s string) (*url.URL, error) { return toURL(s, secure) }
	peerURL, err := toURL(*peer)
	if err != nil {
		return fmt.Errorf("--listen-peer: %w", err)
	}
	clientURL, err := toURL(*client)
	if err != nil {
		return fmt.Errorf("--listen-client: %w", err)
	}
	var members []string
	for m := range strings.SplitSeq(*initial, ",") {
		n, addr, ok := strings.Cut(m, "=")
		if !ok {
			return fmt.Errorf("--initial-cluster: %q is not name=addr", m)
		}
		u, err := toURL(addr)
		if err != nil {
			return fmt.Errorf("--initial-cluster: %w", err)
		}
		members = append(members, n+"="+u.String())
	}

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dataDir
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.InitialCluster = strings.Join(members, ",")
	cfg.InitialClusterToken = *token
	cfg.ClusterState = embed.ClusterStateFlagNew
	if *clientHTTP != "" {
		u, err := toURL(*clientHTTP)
		if err != nil {
			return fmt.Errorf("--listen-client-http: %w", err)
		}
		cfg.ListenClientHttpUrls = []url.URL{*u}
	}
	if secure {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: *certFile, KeyFile: *keyFile, TrustedCAFile: *caFile, ClientCertAuth: *verifyIncoming}
		cfg.PeerTLSInfo = transport.TLSInfo{CertFile: *certFile, KeyFile: *keyFile, TrustedCAFile: *caFile, ClientCertAuth: true}
	}
	cfg.UnsafeNoFsync = *noFsync
	cfg.EnablePprof = *enablePprof
	cfg.LogLevel = *logLevel
	cfg.LogOutputs = []string{"stderr"}

	defer heapfloor.Start(*heapFloorMiB << 20)()

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sig:
		done := make(chan struct{})
		go func() { e.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("stop on %v: etcd did not close within 10s", s)
		}
		return nil
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcd failed: %w", err)
	}
}

// toURL accepts host:port or a URL and returns an http URL, or an https one
// when secure.
func toURL(s string, secure bool) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		if secure {
			s = "https://" + s
		} else {
			s = "http://" + s
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%q has no host:port", s)
	}
	return u, nil
}
