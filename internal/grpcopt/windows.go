// Package grpcopt holds the transport options every Lodestone gRPC server
// and client uses: fixed HTTP/2 flow-control windows (windows.go) and a
// codec that marshals every message into a pooled buffer, or hands gRPC a
// sender's buffer of wire bytes as it is (codec.go).
//
// Windows. Left alone, gRPC sizes its windows by bandwidth-delay
// estimation: after data arrives on a connection it sends a PING (with a
// WINDOW_UPDATE) and times the answer. With small messages spaced apart, as
// a registry's puts and Raft appends are, that is one extra frame each way
// per message, each its own write system call and wake-up on both ends:
// measured on a leader at 1,000 single puts/s, the pings and their
// acknowledgements were about half of its socket writes. Fixed windows turn
// the estimation off. They are credit, not buffers: memory grows only when
// a peer sends more than the receiver reads, and the estimator would have
// grown them to 16 MiB anyway.
package grpcopt

import "google.golang.org/grpc"

const (
	// Stream is the window of one stream: a client's request stream or a
	// watch stream.
	Stream = 1 << 20
	// Conn is the window of a whole connection.
	Conn = 4 << 20
	// PeerStream and PeerConn are the windows between Raft members, sized
	// for 1 MiB snapshot chunks and append batches in flight at once.
	PeerStream = 8 << 20
	PeerConn   = 16 << 20
)

// ServerOptions are the options of a client-facing server: its windows and
// Codec.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InitialWindowSize(Stream), grpc.InitialConnWindowSize(Conn), serverCodec()}
}

// DialOptions are the options of a client's connection: windows and Codec.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(Stream), grpc.WithInitialConnWindowSize(Conn), dialCodec()}
}

// PeerServerOptions are the options of the Raft peer server: windows and
// Codec.
func PeerServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InitialWindowSize(PeerStream), grpc.InitialConnWindowSize(PeerConn), serverCodec()}
}

// PeerDialOptions are the options of a member's connection to a peer:
// windows and Codec.
func PeerDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(PeerStream), grpc.WithInitialConnWindowSize(PeerConn), dialCodec()}
}
