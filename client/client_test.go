package client

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client/clienttest"
)

// fastRetry keeps retry tests quick: tiny backoffs, short dial timeout.
func fastRetry(endpoints ...string) Config {
	return Config{Endpoints: endpoints, DialTimeout: time.Second, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond,
		ReconnectBase: time.Millisecond, ReconnectMax: 5 * time.Millisecond}
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func unavailable(context.Context, *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
	return nil, status.Error(codes.Unavailable, "no leader; retry after the election (about 1s)")
}

func memoryServer(t *testing.T, name string) (*clienttest.Server, *clienttest.Memory) {
	m := clienttest.NewMemory(&lodestonepb.Member{Name: name})
	return clienttest.Start(t, m.Funcs()), m
}

// TestWriteRetriedAfterUnavailable: Unavailable proves the write was not
// applied, so it moves to the next endpoint.
func TestWriteRetriedAfterUnavailable(t *testing.T) {
	t.Parallel()
	a := clienttest.Start(t, &clienttest.Funcs{Put: unavailable})
	b, _ := memoryServer(t, "b")
	c := newTestClient(t, fastRetry(a.Addr, b.Addr))
	if _, err := c.Put(testCtx(t, 5*time.Second), "k", []byte("v")); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if got, want := a.Calls("Put"), 1; got != want {
		t.Errorf("Put calls on a = %d, want %d", got, want)
	}
	if got, want := b.Calls("Put"), 1; got != want {
		t.Errorf("Put calls on b = %d, want %d", got, want)
	}
}

// TestWriteRetriedOnSameEndpoint: one endpoint that answers Unavailable
// twice (an election) and then succeeds.
func TestWriteRetriedOnSameEndpoint(t *testing.T) {
	t.Parallel()
	m := clienttest.NewMemory(&lodestonepb.Member{Name: "a"})
	f := m.Funcs()
	var n atomic.Int32
	put := f.Put
	f.Put = func(ctx context.Context, r *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
		if n.Add(1) <= 2 {
			return unavailable(ctx, r)
		}
		return put(ctx, r)
	}
	a := clienttest.Start(t, f)
	c := newTestClient(t, fastRetry(a.Addr))
	if _, err := c.Put(testCtx(t, 5*time.Second), "k", []byte("v")); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if got, want := a.Calls("Put"), 3; got != want {
		t.Errorf("Put calls = %d, want %d", got, want)
	}
}

// TestWriteNotRetriedAfterMidCallFailure: the connection drops after the
// server received the write; it may have been applied, so the client
// must not send it again anywhere.
func TestWriteNotRetriedAfterMidCallFailure(t *testing.T) {
	t.Parallel()
	var a *clienttest.Server
	received := make(chan struct{}, 1)
	a = clienttest.Start(t, &clienttest.Funcs{Put: func(ctx context.Context, _ *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
		received <- struct{}{}
		a.DropConnections()
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	b, _ := memoryServer(t, "b")
	c := newTestClient(t, fastRetry(a.Addr, b.Addr))
	_, err := c.Put(testCtx(t, 5*time.Second), "k", []byte("v"))
	<-received
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Errorf("Put error = %v, want ErrUnknownOutcome", err)
	}
	var ce *Error
	if !errors.As(err, &ce) || ce.FromServer {
		t.Errorf("Put error = %#v, want *Error not from a server", err)
	}
	if got, want := b.Calls("Put"), 0; got != want {
		t.Errorf("Put calls on b = %d, want %d (no retry after a mid-call failure)", got, want)
	}
	if got, want := a.Calls("Put"), 1; got != want {
		t.Errorf("Put calls on a = %d, want %d", got, want)
	}
}

// TestWriteNotRetriedAfterDeadline: a write that timed out after it was
// sent is returned at the deadline, outcome unknown, and never resent.
func TestWriteNotRetriedAfterDeadline(t *testing.T) {
	t.Parallel()
	hang := func(ctx context.Context, _ *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	a := clienttest.Start(t, &clienttest.Funcs{Put: hang})
	b, _ := memoryServer(t, "b")
	c := newTestClient(t, fastRetry(a.Addr, b.Addr))
	const deadline = 300 * time.Millisecond
	start := time.Now()
	_, err := c.Put(testCtx(t, deadline), "k", []byte("v"))
	if elapsed := time.Since(start); elapsed > deadline+slack {
		t.Errorf("Put returned after %v, want within %v", elapsed, deadline+slack)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrUnknownOutcome) {
		t.Errorf("Put error = %v, want DeadlineExceeded and ErrUnknownOutcome", err)
	}
	if got, want := b.Calls("Put"), 0; got != want {
		t.Errorf("Put calls on b = %d, want %d", got, want)
	}
}

// TestWriteNotRetriedAfterServerDeadline: a server that answers
// DeadlineExceeded may have proposed the write.
func TestWriteNotRetriedAfterServerDeadline(t *testing.T) {
	t.Parallel()
	a := clienttest.Start(t, &clienttest.Funcs{Put: func(context.Context, *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
		return nil, status.Error(codes.DeadlineExceeded, "proposal timed out")
	}})
	b, _ := memoryServer(t, "b")
	c := newTestClient(t, fastRetry(a.Addr, b.Addr))
	_, err := c.Put(testCtx(t, 5*time.Second), "k", []byte("v"))
	var ce *Error
	if !errors.As(err, &ce) || !ce.FromServer || !ce.UnknownOutcome || ce.Message != "proposal timed out" {
		t.Errorf("Put error = %#v, want server's DeadlineExceeded with unknown outcome", err)
	}
	if got, want := b.Calls("Put"), 0; got != want {
		t.Errorf("Put calls on b = %d, want %d", got, want)
	}
}

// TestReadRetriedAcrossEndpoints: reads are safe to repeat, so any
// transport failure, Unavailable or server deadline moves them on.
func TestReadRetriedAcrossEndpoints(t *testing.T) {
	t.Parallel()
	var a *clienttest.Server
	a = clienttest.Start(t, &clienttest.Funcs{
		Get: func(ctx context.Context, _ *lodestonepb.GetRequest) (*lodestonepb.GetResponse, error) {
			a.DropConnections() // mid-call
			<-ctx.Done()
			return nil, ctx.Err()
		},
		Range: func(context.Context, *lodestonepb.RangeRequest) (*lodestonepb.RangeResponse, error) {
			return nil, status.Error(codes.Unavailable, "no leader")
		},
		Members: func(context.Context, *lodestonepb.MembersRequest) (*lodestonepb.MembersResponse, error) {
			return nil, status.Error(codes.DeadlineExceeded, "read index timed out")
		},
	})
	b, m := memoryServer(t, "b")
	if _, err := m.Funcs().Put(context.Background(), &lodestonepb.PutRequest{Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method string
		call   func(context.Context, *Client) error
	}{
		{"Get", func(ctx context.Context, c *Client) error {
			r, err := c.Get(ctx, "k")
			if err == nil && string(r.GetKv().GetValue()) != "v" {
				return errors.New("wrong value " + string(r.GetKv().GetValue()))
			}
			return err
		}},
		{"Range", func(ctx context.Context, c *Client) error { _, err := c.Range(ctx, ""); return err }},
		{"Members", func(ctx context.Context, c *Client) error { _, err := c.Members(ctx); return err }},
	} {
		t.Run(tc.method, func(t *testing.T) {
			c := newTestClient(t, fastRetry(a.Addr, b.Addr))
			if err := tc.call(testCtx(t, 5*time.Second), c); err != nil {
				t.Fatalf("%s: %v", tc.method, err)
			}
			if got, want := a.Calls(tc.method), 1; got != want {
				t.Errorf("%s calls on a = %d, want %d", tc.method, got, want)
			}
			if got, want := b.Calls(tc.method), 1; got != want {
				t.Errorf("%s calls on b = %d, want %d", tc.method, got, want)
			}
		})
	}
}

// TestLeaderPreference: once a Members answer names the leader and its
// address, calls go to the leader first; when the leader fails the client
// forgets it and works through the other endpoints.
func TestLeaderPreference(t *testing.T) {
	t.Parallel()
	ma := clienttest.NewMemory(&lodestonepb.Member{Name: "a"})
	mb := clienttest.NewMemory(&lodestonepb.Member{Name: "b"})
	fa, fb := ma.Funcs(), mb.Funcs()
	var a, b *clienttest.Server
	members := func() []*lodestonepb.Member {
		return []*lodestonepb.Member{{Id: 1, Name: "a", GrpcAddr: a.Addr}, {Id: 2, Name: "b", GrpcAddr: b.Addr}}
	}
	// a follows b; b leads, until b steps down.
	var bDown atomic.Bool
	fa.Members = func(context.Context, *lodestonepb.MembersRequest) (*lodestonepb.MembersResponse, error) {
		return &lodestonepb.MembersResponse{Header: &lodestonepb.ResponseHeader{LeaderId: 2, NodeId: 1, KnownLeader: true}, Members: members()}, nil
	}
	putA := fa.Put
	fa.Put = func(ctx context.Context, r *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
		resp, err := putA(ctx, r)
		if resp != nil {
			resp.Header.LeaderId, resp.Header.NodeId = 1, 1 // a won the new election
		}
		return resp, err
	}
	putB := fb.Put
	fb.Put = func(ctx context.Context, r *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
		if bDown.Load() {
			return unavailable(ctx, r)
		}
		resp, err := putB(ctx, r)
		if resp != nil {
			resp.Header.LeaderId, resp.Header.NodeId = 2, 2
		}
		return resp, err
	}
	a, b = clienttest.Start(t, fa), clienttest.Start(t, fb)
	c := newTestClient(t, fastRetry(a.Addr, b.Addr))
	ctx := testCtx(t, 5*time.Second)

	if _, err := c.Members(ctx); err != nil {
		t.Fatalf("Members: %v", err)
	}
	if got, want := c.Endpoints()[0], b.Addr; got != want {
		t.Errorf("first endpoint after Members = %s, want leader b %s", got, want)
	}
	for range 3 {
		if _, err := c.Put(ctx, "k", []byte("v")); err != nil {
			t.Fatalf("Put: %v", err)
		}
	}
	if got, want := b.Calls("Put"), 3; got != want {
		t.Errorf("Put calls on leader b = %d, want %d", got, want)
	}
	if got, want := a.Calls("Put"), 0; got != want {
		t.Errorf("Put calls on follower a = %d, want %d", got, want)
	}

	bDown.Store(true)
	if _, err := c.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("Put after leader stepped down: %v", err)
	}
	if got, want := a.Calls("Put"), 1; got != want {
		t.Errorf("Put calls on a after b stepped down = %d, want %d", got, want)
	}
	if got, want := c.LeaderID(), uint64(1); got != want {
		t.Errorf("LeaderID = %d, want %d (from a's answer)", got, want)
	}
	if got, want := c.Endpoints()[0], a.Addr; got != want {
		t.Errorf("first endpoint = %s, want new leader a %s", got, want)
	}
}

// TestErrorMapping: server codes map to sentinels, keep the server's
// message, and are not retried.
func TestErrorMapping(t *testing.T) {
	t.Parallel()
	s, _ := memoryServer(t, "a")
	c := newTestClient(t, fastRetry(s.Addr))
	ctx := testCtx(t, 5*time.Second)

	if _, err := c.Put(ctx, "k", []byte("v"), WithCAS(0)); err != nil {
		t.Fatalf("first CAS put: %v", err)
	}
	_, err := c.Put(ctx, "k", []byte("v"), WithCAS(0))
	if !errors.Is(err, ErrCASFailed) {
		t.Errorf("second CAS put error = %v, want ErrCASFailed", err)
	}
	if err != nil && !strings.Contains(err.Error(), `key "k" has modify index`) {
		t.Errorf("error %q lost the server's message", err)
	}
	if got, want := s.Calls("Put"), 2; got != want {
		t.Errorf("Put calls = %d, want %d", got, want)
	}
	if got, want := status.Code(err), codes.FailedPrecondition; got != want {
		t.Errorf("status.Code = %v, want %v", got, want)
	}

	if _, err := c.Put(ctx, "", nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("empty key put error = %v, want ErrInvalidArgument", err)
	}
	if _, err := c.RemoveMember(ctx, ByName("nope")); !errors.Is(err, ErrNotFound) {
		t.Errorf("remove unknown member error = %v, want ErrNotFound", err)
	}
	if _, err := c.Delete(ctx, "k", Prefix(), DeleteCAS(1)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("prefix CAS delete error = %v, want ErrInvalidArgument", err)
	}
}

// TestMaxAttempts caps attempts; the error is the last Unavailable.
func TestMaxAttempts(t *testing.T) {
	t.Parallel()
	a := clienttest.Start(t, &clienttest.Funcs{Put: unavailable})
	cfg := fastRetry(a.Addr)
	cfg.MaxAttempts = 3
	c := newTestClient(t, cfg)
	_, err := c.Put(testCtx(t, 5*time.Second), "k", nil)
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrUnknownOutcome) {
		t.Errorf("Put error = %v, want ErrUnavailable with known outcome", err)
	}
	if got, want := a.Calls("Put"), 3; got != want {
		t.Errorf("Put calls = %d, want %d", got, want)
	}
}

// TestBackoffNeverOutlivesDeadline: when the next backoff would pass the
// deadline the call returns the last failure at once.
func TestBackoffNeverOutlivesDeadline(t *testing.T) {
	t.Parallel()
	a := clienttest.Start(t, &clienttest.Funcs{Put: unavailable})
	c := newTestClient(t, Config{Endpoints: []string{a.Addr}, BackoffBase: 5 * time.Second, BackoffMax: 5 * time.Second})
	start := time.Now()
	_, err := c.Put(testCtx(t, 2*time.Second), "k", nil)
	if elapsed := time.Since(start); elapsed > slack {
		t.Errorf("Put returned after %v, want at once", elapsed)
	}
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "no leader") {
		t.Errorf("Put error = %v, want the server's Unavailable", err)
	}
}

// TestRetryInfoHint: a RetryInfo detail sets the delay before the retry.
func TestRetryInfoHint(t *testing.T) {
	t.Parallel()
	const hint = 200 * time.Millisecond
	var first atomic.Int64
	f := clienttest.NewMemory(&lodestonepb.Member{Name: "a"}).Funcs()
	f.Put = failFirst(f.Put, withRetryInfo(codes.Unavailable, "leader election in progress", hint), &first)
	a := clienttest.Start(t, f)
	c := newTestClient(t, fastRetry(a.Addr))
	if _, err := c.Put(testCtx(t, 5*time.Second), "k", nil); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if got := time.Since(time.Unix(0, first.Load())); got < hint {
		t.Errorf("retry after %v, want at least the hinted %v", got, hint)
	}
}

// withRetryInfo is a server's error with a retry hint.
func withRetryInfo(c codes.Code, msg string, hint time.Duration) error {
	st, _ := status.New(c, msg).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(hint)})
	return st.Err()
}

// refusal is admission control's answer: RESOURCE_EXHAUSTED with the
// slot it booked the caller.
func refusal(hint time.Duration) error {
	return withRetryInfo(codes.ResourceExhausted, "admission control: retry later", hint)
}

// failFirst answers the first call with err, noting when in at, and
// every later one with call.
func failFirst[Req, Resp any](call func(context.Context, Req) (Resp, error), err error, at *atomic.Int64) func(context.Context, Req) (Resp, error) {
	return func(ctx context.Context, r Req) (Resp, error) {
		if at.CompareAndSwap(0, time.Now().UnixNano()) {
			var zero Resp
			return zero, err
		}
		return call(ctx, r)
	}
}

// TestAdmissionRefusalRetriedWhereBooked: a server that refuses with a
// retry hint booked the caller a slot there, so the call waits the hint
// and goes back to it, asking no other endpoint meanwhile.
func TestAdmissionRefusalRetriedWhereBooked(t *testing.T) {
	t.Parallel()
	const hint = 150 * time.Millisecond
	var refusedAt atomic.Int64
	f := clienttest.NewMemory(&lodestonepb.Member{Name: "a"}).Funcs()
	f.Get = failFirst(f.Get, refusal(hint), &refusedAt)
	a := clienttest.Start(t, f)
	b, _ := memoryServer(t, "b")
	c := newTestClient(t, fastRetry(a.Addr, b.Addr))
	if _, err := c.Get(testCtx(t, 5*time.Second), "k"); err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got := time.Since(time.Unix(0, refusedAt.Load())); got < hint {
		t.Errorf("retried %v after the refusal, want at least the hinted %v", got, hint)
	}
	if got, want := a.Calls("Get"), 2; got != want {
		t.Errorf("Get calls on the refusing server = %d, want %d (the refusal, then its booked slot)", got, want)
	}
	if got := b.Calls("Get"); got != 0 {
		t.Errorf("Get calls on the other server = %d, want 0", got)
	}
}

func TestClosed(t *testing.T) {
	t.Parallel()
	s, _ := memoryServer(t, "a")
	c := newTestClient(t, fastRetry(s.Addr))
	if _, err := c.Get(testCtx(t, 5*time.Second), "k"); err != nil {
		t.Fatalf("Get: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := c.Get(testCtx(t, 5*time.Second), "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close error = %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestServerComesBack: an endpoint that refused connections serves again
// once a server listens there; the client reconnects by itself.
func TestServerComesBack(t *testing.T) {
	t.Parallel()
	addr := refusedEndpoint(t)
	c := newTestClient(t, fastRetry(addr))
	ctx := testCtx(t, 200*time.Millisecond)
	if _, err := c.Get(ctx, "k"); !errors.Is(err, ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get with no server: %v, want ErrUnavailable or DeadlineExceeded", err)
	}
	m := clienttest.NewMemory(&lodestonepb.Member{Name: "a"})
	s := clienttest.StartAt(t, addr, m.Funcs())
	if _, err := c.Put(testCtx(t, 5*time.Second), "k", []byte("v")); err != nil {
		t.Fatalf("Put after the server came back: %v", err)
	}
	if got, want := s.Calls("Put"), 1; got != want {
		t.Errorf("Put calls = %d, want %d", got, want)
	}
}
