package grpcopt_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/lodestone-kv/lodestone/internal/grpcopt"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pingCounter relays a gRPC connection and counts the PING frames (not
// acknowledgements) the server sends.
type pingCounter struct {
	lis   net.Listener
	to    string
	pings atomic.Int64
	wg    sync.WaitGroup
}

func (p *pingCounter) serve() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.to)
		if err != nil {
			c.Close()
			continue
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(s, c); s.Close() }()
		go func() { defer p.wg.Done(); p.countFrames(c, s); c.Close() }()
	}
}

// countFrames copies the server's HTTP/2 frames to the client, counting
// pings (type 6 without the ACK flag).
func (p *pingCounter) countFrames(dst io.Writer, src io.Reader) {
	hdr := make([]byte, 9)
	for {
		if _, err := io.ReadFull(src, hdr); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(append([]byte{0}, hdr[:3]...)))
		if hdr[3] == 6 && hdr[4]&1 == 0 {
			p.pings.Add(1)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(src, body); err != nil {
			return
		}
		if _, err := dst.Write(append(hdr, body...)); err != nil {
			return
		}
	}
}

// serverPings makes unary calls spaced apart, as a registry's clients do,
// and returns how many pings the server sent.
func serverPings(t *testing.T, sopts []grpc.ServerOption, dopts []grpc.DialOption) int64 {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(sopts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	var served sync.WaitGroup
	served.Add(1)
	go func() {
		defer served.Done()
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serve: %v", err)
		}
	}()

	plis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Stop()
		served.Wait()
		t.Fatal(err)
	}
	pc := &pingCounter{lis: plis, to: lis.Addr().String()}
	pc.wg.Add(1)
	go pc.serve()
	// NB: stopping the server closes its side of each relayed connection,
	// which ends the relay's copies.
	defer func() { plis.Close(); srv.Stop(); pc.wg.Wait(); served.Wait() }()

	conn, err := grpc.NewClient("passthrough:///"+plis.Addr().String(),
		append(dopts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // calls arrive apart, not pipelined
	}
	return pc.pings.Load()
}

func TestFixedWindowsSendNoPings(t *testing.T) {
	// The counter must see the estimator's pings when it runs, or a zero
	// below would prove nothing.
	if n := serverPings(t, nil, nil); n == 0 {
		t.Fatal("default options: the server sent no ping; the counter is broken")
	}
	if n := serverPings(t, grpcopt.ServerOptions(), grpcopt.DialOptions()); n != 0 {
		t.Fatalf("client windows: the server sent %d pings, want 0", n)
	}
	if n := serverPings(t, grpcopt.PeerServerOptions(), grpcopt.PeerDialOptions()); n != 0 {
		t.Fatalf("peer windows: the server sent %d pings, want 0", n)
	}
}
