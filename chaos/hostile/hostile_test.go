package hostile

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/server"
	"github.com/lodestone-kv/lodestone/server/servertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The hostile client, from its own loopback address, reaches every limit
// it aims at and is refused each time, while a client from another
// address keeps working; when Run returns, nothing it opened is left.
func TestHostileIsRefusedAndOthersAreNot(t *testing.T) {
	lim := Limits{GRPCConnsPerClient: 6, HTTPConnsPerClient: 6, WatchesPerStream: 8, WatchesPerConn: 16,
		TxnRequestBytes: 64 << 10, ValueBytes: 32 << 10, TxnOps: 8, RequestBytes: 256 << 10}
	srv := servertest.Start(t, func(cfg *server.Config) {
		cfg.MaxGRPCConnectionsPerClient, cfg.MaxHTTPConnectionsPerClient = lim.GRPCConnsPerClient, lim.HTTPConnsPerClient
		cfg.MaxWatchesPerStream, cfg.MaxWatchesPerConnection = lim.WatchesPerStream, lim.WatchesPerConn
		cfg.MaxTxnRequestBytes, cfg.Limits.MaxValueBytes, cfg.Limits.MaxTxnOps = lim.TxnRequestBytes, lim.ValueBytes, lim.TxnOps
		cfg.MaxRequestBytes = lim.RequestBytes
		cfg.HTTPIdleTimeout = 2 * time.Second // so the header timeout is 2s
	})
	// 127.0.0.2 is loopback too on Linux: its own source address.
	if l, err := net.Listen("tcp", "127.0.0.2:0"); err != nil {
		t.Skipf("cannot bind 127.0.0.2: %v", err)
	} else {
		l.Close()
	}
	cl := New(Config{
		Targets: []Target{{Name: "r1", GRPCAddr: srv.GRPCAddr(), HTTPAddr: srv.HTTPAddr()}},
		LocalIP: "127.0.0.2", Prefix: "hostile/", Forbidden: "w/x", Limits: lim,
		HoldEvery: 300 * time.Millisecond, AbuseEvery: 40 * time.Millisecond, WatchEvery: time.Second, SlowEvery: 300 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); cl.Run(ctx) }()

	// A checked client from 127.0.0.1 meanwhile.
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kv := lodestonepb.NewKVClient(conn)
	deadline := time.Now().Add(5 * time.Second)
	ok, failed := 0, 0
	for time.Now().Before(deadline) {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := kv.Put(cctx, &lodestonepb.PutRequest{Key: []byte("w/k"), Value: []byte("v")})
		ccancel()
		if err != nil {
			failed++
		} else {
			ok++
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of cancel")
	}
	s := cl.Summary()
	t.Logf("checked client: %d ok, %d failed; hostile: %s", ok, failed, strings.Join(s.Lines(), "\n  "))
	if ok < 20 || failed > ok/10 {
		t.Errorf("the checked client suffered: %d ok, %d failed", ok, failed)
	}
	want := map[string]string{
		"grpc over the cap":                   "refused at accept (cap 6)",
		"http over the cap":                   "refused at accept (cap 6)",
		"http txn over max-txn-request-bytes": "413",
		"http txn malformed JSON":             "400",
		"http kv put over max-value-bytes":    "413",
		"http kv put invalid UTF-8 key":       "400",
		"grpc txn over max-txn-ops":           "InvalidArgument",
		"grpc txn over max-value-bytes":       "InvalidArgument",
		"grpc put invalid UTF-8 key":          "InvalidArgument",
		"grpc txn over max-request-bytes":     "ResourceExhausted",
		"grpc watch create":                   "refused (max-watches-per-stream)",
		"http-slowloris held":                 "closed by the server",
		"http-idle held":                      "closed by the server",
	}
	for act, outcome := range want {
		if s.Counts[act][outcome] == 0 {
			t.Errorf("%s: no %q; got %v", act, outcome, s.Counts[act])
		}
	}
	if s.Counts["grpc watch create"]["refused (max-watches-per-connection)"] == 0 {
		t.Errorf("watch flood never reached the per-connection limit: %v", s.Counts["grpc watch create"])
	}
	if s.HeldMax["grpc"] != lim.GRPCConnsPerClient-3 || s.HeldMax["http"] != lim.HTTPConnsPerClient-3 {
		t.Errorf("held at most %v, want the cap less the reserve (3)", s.HeldMax)
	}
	if r, total := s.Refused(); r == 0 || total == 0 {
		t.Errorf("refused %d of %d", r, total)
	}
}
