package client

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client/clienttest"
)

// slack is how far past its deadline a call may return: scheduling under
// -race, never a retry or a backoff.
const slack = 250 * time.Millisecond

// silentEndpoint returns the address of a TCP listener that accepts every
// connection and never sends a byte: TCP connects, HTTP/2 never starts.
func silentEndpoint(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// unacceptingEndpoint returns the address of a listening socket with a
// backlog of 0 that is never accepted from, after filling its accept queue:
// the kernel drops further SYNs, so a connect hangs in SYN-SENT, as with a
// black-holed route.
func unacceptingEndpoint(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	var fill []net.Conn
	t.Cleanup(func() {
		for _, c := range fill {
			_ = c.Close()
		}
		_ = syscall.Close(fd)
	})
	for range 16 {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return addr // the queue is full: connects now hang
		}
		fill = append(fill, c)
	}
	t.Skipf("could not fill the accept queue of %s; the kernel accepts past backlog 0", addr)
	return ""
}

// refusedEndpoint returns an address where nothing listens.
func refusedEndpoint(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// ops are one call of each kind, reads and writes.
var ops = []struct {
	name  string
	write bool
	call  func(context.Context, *Client) error
}{
	{"get", false, func(ctx context.Context, c *Client) error { _, err := c.Get(ctx, "k"); return err }},
	{"range", false, func(ctx context.Context, c *Client) error { _, err := c.Range(ctx, "k/"); return err }},
	{"members", false, func(ctx context.Context, c *Client) error { _, err := c.Members(ctx); return err }},
	{"status", false, func(ctx context.Context, c *Client) error { _, err := c.Status(ctx, ""); return err }},
	{"put", true, func(ctx context.Context, c *Client) error { _, err := c.Put(ctx, "k", []byte("v")); return err }},
	{"delete", true, func(ctx context.Context, c *Client) error { _, err := c.Delete(ctx, "k"); return err }},
	{"txn", true, func(ctx context.Context, c *Client) error {
		_, err := c.Txn(ctx, []*lodestonepb.TxnOp{{Verb: lodestonepb.TxnOp_SET, Key: []byte("k")}})
		return err
	}},
	{"add-member", true, func(ctx context.Context, c *Client) error {
		_, err := c.AddMember(ctx, &lodestonepb.Member{Name: "n9", PeerAddr: "127.0.0.1:1"})
		return err
	}},
	{"transfer-leader", true, func(ctx context.Context, c *Client) error { _, err := c.TransferLeader(ctx, nil); return err }},
}

// TestBlackHoleHonorsDeadline proves that no call outlives its ctx against
// endpoints that never answer, whether they accept TCP and stay silent or
// never accept at all, and that a write that never left the client is not
// reported as possibly applied.
func TestBlackHoleHonorsDeadline(t *testing.T) {
	t.Parallel()
	holes := []struct {
		name string
		addr func(*testing.T) string
	}{
		{"accepts-never-answers", silentEndpoint},
		{"never-accepts", unacceptingEndpoint},
	}
	for _, h := range holes {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			addr := h.addr(t)
			for _, op := range ops {
				t.Run(op.name, func(t *testing.T) {
					t.Parallel()
					// DialTimeout exceeds the deadline: only ctx can end the call.
					c := newTestClient(t, Config{Endpoints: []string{addr}, DialTimeout: 10 * time.Second})
					const deadline = 300 * time.Millisecond
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					defer cancel()
					start := time.Now()
					err := op.call(ctx, c)
					elapsed := time.Since(start)
					if elapsed > deadline+slack {
						t.Errorf("%s returned after %v, want within %v", op.name, elapsed, deadline+slack)
					}
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("%s error = %v, want context.DeadlineExceeded", op.name, err)
					}
					if errors.Is(err, ErrUnknownOutcome) {
						t.Errorf("%s error = %v, want a known outcome: the request never left", op.name, err)
					}
				})
			}
		})
	}
}

// TestRequestTimeoutWithoutDeadline: a ctx without deadline gets
// Config.RequestTimeout.
func TestRequestTimeoutWithoutDeadline(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	c := newTestClient(t, Config{Endpoints: []string{silentEndpoint(t)}, RequestTimeout: timeout, DialTimeout: 10 * time.Second})
	start := time.Now()
	_, err := c.Get(context.Background(), "k")
	if elapsed := time.Since(start); elapsed > timeout+slack {
		t.Errorf("Get returned after %v, want within %v", elapsed, timeout+slack)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Get error = %v, want context.DeadlineExceeded", err)
	}
}

// TestBlackHoleFailover: DialTimeout gives up on a black-holed endpoint
// and the call, write or read, completes on the next one. A write may
// move on because it never left the client.
func TestBlackHoleFailover(t *testing.T) {
	t.Parallel()
	holes := []struct {
		name string
		addr func(*testing.T) string
	}{
		{"accepts-never-answers", silentEndpoint},
		{"never-accepts", unacceptingEndpoint},
		{"refused", refusedEndpoint},
	}
	for _, h := range holes {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			good := clienttest.Start(t, clienttest.NewMemory(&lodestonepb.Member{Name: "n1"}).Funcs())
			const dialTimeout = 200 * time.Millisecond
			c := newTestClient(t, Config{Endpoints: []string{h.addr(t), good.Addr}, DialTimeout: dialTimeout})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			if _, err := c.Put(ctx, "k", []byte("v")); err != nil {
				t.Fatalf("Put: %v", err)
			}
			if elapsed := time.Since(start); elapsed > dialTimeout+slack+time.Second {
				t.Errorf("Put took %v, want about DialTimeout %v", elapsed, dialTimeout)
			}
			// The client now starts at the endpoint that answered.
			start = time.Now()
			if _, err := c.Get(ctx, "k"); err != nil {
				t.Fatalf("Get: %v", err)
			}
			if elapsed := time.Since(start); elapsed > slack {
				t.Errorf("second call took %v, want it to start at the live endpoint", elapsed)
			}
			if got, want := good.Calls("Put"), 1; got != want {
				t.Errorf("Put calls on live endpoint = %d, want %d", got, want)
			}
		})
	}
}

// TestRefusedEverywhere: with no server running a call fails within its
// deadline, saying no server was available.
func TestRefusedEverywhere(t *testing.T) {
	t.Parallel()
	c := newTestClient(t, Config{Endpoints: []string{refusedEndpoint(t), refusedEndpoint(t)}, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	const deadline = 400 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	_, err := c.Put(ctx, "k", []byte("v"))
	if elapsed := time.Since(start); elapsed > deadline+slack {
		t.Errorf("Put returned after %v, want within %v", elapsed, deadline+slack)
	}
	if !errors.Is(err, ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Put error = %v, want ErrUnavailable or DeadlineExceeded", err)
	}
	if errors.Is(err, ErrUnknownOutcome) {
		t.Errorf("Put error = %v, want a known outcome", err)
	}
}

func newTestClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
