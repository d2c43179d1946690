package client_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/client/clienttest"
)

// TestRPCTrace checks the face that code making its own gRPC calls (the
// chaos workloads) uses: what an RPCTrace says after a Put, for each way
// the Put can end. Sent is what proves a write may have been applied,
// Responded what proves the error is a server's answer.
func TestRPCTrace(t *testing.T) {
	answered := func(context.Context, *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
		return nil, status.Error(codes.Unavailable, "no leader")
	}
	// arrived closes when the silent server holds the request; the
	// caller then gives up, so the server never answers.
	arrived := make(chan struct{})
	silent := func(ctx context.Context, _ *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
		close(arrived)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	for _, tc := range []struct {
		name     string
		addr     func(t *testing.T) string
		untraced bool            // dial without RPCTraceDialOption
		cancelOn <-chan struct{} // cancel the Put when it closes

		wantCode                codes.Code
		wantSent, wantResponded bool
	}{
		{
			name: "ok",
			addr: serving(&clienttest.Funcs{Put: func(context.Context, *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
				return &lodestonepb.PutResponse{}, nil
			}}),
			wantCode: codes.OK, wantSent: true, wantResponded: true,
		},
		{
			name:     "server answered an error",
			addr:     serving(&clienttest.Funcs{Put: answered}),
			wantCode: codes.Unavailable, wantSent: true, wantResponded: true,
		},
		{
			// NB: canceled, not timed out: gRPC sends the deadline to
			// the server, whose own DeadlineExceeded status may come
			// back first, and then Responded is rightly true.
			name:     "sent, caller gave up before an answer",
			addr:     serving(&clienttest.Funcs{Put: silent}),
			cancelOn: arrived,
			wantCode: codes.Canceled, wantSent: true, wantResponded: false,
		},
		{
			name:     "nothing listening",
			addr:     closedPort,
			wantCode: codes.Unavailable, wantSent: false, wantResponded: false,
		},
		{
			// Without the dial option nothing fills the trace.
			name:     "untraced connection",
			addr:     serving(&clienttest.Funcs{Put: answered}),
			untraced: true,
			wantCode: codes.Unavailable, wantSent: false, wantResponded: false,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
			if !tc.untraced {
				opts = append(opts, client.RPCTraceDialOption())
			}
			cc, err := grpc.NewClient(tc.addr(t), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()

			tctx, tr := client.WithRPCTrace(context.Background())
			ctx, cancel := context.WithTimeout(tctx, 10*time.Second)
			defer cancel()
			if tc.cancelOn != nil {
				go func() {
					select {
					case <-tc.cancelOn:
						cancel()
					case <-ctx.Done():
					}
				}()
			}
			_, err = lodestonepb.NewKVClient(cc).Put(ctx, &lodestonepb.PutRequest{Key: []byte("k")})
			if got, want := status.Code(err), tc.wantCode; got != want {
				t.Fatalf("Put code = %v (%v), want %v", got, err, want)
			}
			if got, want := tr.Sent(), tc.wantSent; got != want {
				t.Errorf("Sent() = %v, want %v", got, want)
			}
			if got, want := tr.Responded(), tc.wantResponded; got != want {
				t.Errorf("Responded() = %v, want %v", got, want)
			}
		})
	}
}

// serving returns an addr func that starts a server of f for the test.
func serving(f *clienttest.Funcs) func(t *testing.T) string {
	return func(t *testing.T) string { return clienttest.Start(t, f).Addr }
}

// closedPort returns a loopback address that nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
