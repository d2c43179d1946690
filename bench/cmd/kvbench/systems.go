package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/grpcopt"
)

// logLevel is given to the servers of both systems: warnings and errors
// reach the per-member log files, per-request chatter does not.
const logLevel = "warn"

var errNoLeader = errors.New("no member reports itself leader")

func initialCluster(names, peers []string) string {
	var parts []string
	for i := range names {
		parts = append(parts, names[i]+"="+peers[i])
	}
	return strings.Join(parts, ",")
}

// lodestoneSystem runs `lodestone server` members and talks to them with the
// raw generated gRPC API.
func lodestoneSystem(bin string) system {
	return system{
		name: "lodestone",
		// client/ dials with fixed flow-control windows; clientv3 keeps
		// gRPC's defaults (bandwidth estimation on).
		dialOptions: grpcopt.DialOptions(),
		bin:         bin,
		args: func(i int, names, peers, clients, http []string, dataDir string) []string {
			return []string{"server",
				"--name", names[i],
				"--data-dir", dataDir,
				"--listen-peer", peers[i],
				"--listen-grpc", clients[i],
				"--listen-http", http[i],
				"--initial-cluster", initialCluster(names, peers),
				"--log-level", logLevel,
			}
		},
		leader: func(ctx context.Context, clients []string) (string, error) {
			var errs []error
			for _, addr := range clients {
				conn, err := dial(addr)
				if err != nil {
					return "", err
				}
				st, err := lodestonepb.NewClusterClient(conn).Status(ctx, &lodestonepb.StatusRequest{})
				conn.Close()
				if err != nil {
					errs = append(errs, fmt.Errorf("status %s: %w", addr, err))
					continue
				}
				if st.GetLeaderId() != 0 && st.GetLeaderId() == st.GetSelf().GetId() {
					return addr, nil
				}
			}
			return "", errors.Join(append(errs, errNoLeader)...)
		},
		put: func(conn *grpc.ClientConn) func(ctx context.Context, key, value []byte) error {
			kv := lodestonepb.NewKVClient(conn)
			return func(ctx context.Context, key, value []byte) error {
				_, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: key, Value: value})
				return err
			}
		},
	}
}

// etcdSystem runs etcdnode members (embedded etcd, fsync on). Leader
// discovery uses clientv3's Status; puts use etcd's raw generated KV stub
// over a plain gRPC connection, as Lodestone's puts do, so neither
// side pays for a client library's retry and balancing layers.
func etcdSystem(bin string) system {
	return system{
		name: "etcd",
		bin:  bin,
		args: func(i int, names, peers, clients, _ []string, dataDir string) []string {
			return []string{
				"--name", names[i],
				"--data-dir", dataDir,
				"--listen-peer", peers[i],
				"--listen-client", clients[i],
				"--initial-cluster", initialCluster(names, peers),
				"--log-level", logLevel,
			}
		},
		leader: func(ctx context.Context, clients []string) (string, error) {
			cli, err := clientv3.New(clientv3.Config{Endpoints: clients, Logger: zap.NewNop()})
			if err != nil {
				return "", fmt.Errorf("etcd client: %w", err)
			}
			defer cli.Close()
			var errs []error
			for _, ep := range clients {
				st, err := cli.Status(ctx, ep)
				if err != nil {
					errs = append(errs, fmt.Errorf("status %s: %w", ep, err))
					continue
				}
				if st.Leader != 0 && st.Leader == st.Header.GetMemberId() {
					return ep, nil
				}
			}
			return "", errors.Join(append(errs, errNoLeader)...)
		},
		put: func(conn *grpc.ClientConn) func(ctx context.Context, key, value []byte) error {
			kv := etcdserverpb.NewKVClient(conn)
			return func(ctx context.Context, key, value []byte) error {
				_, err := kv.Put(ctx, &etcdserverpb.PutRequest{Key: key, Value: value})
				return err
			}
		},
	}
}
