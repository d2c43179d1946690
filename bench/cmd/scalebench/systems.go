package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// logLevel is given to both systems' servers.
const logLevel = "warn"

// probeKey is the key the start probe writes.
const probeKey = "scalebench/probe"

var errNoLeader = errors.New("no member reports itself leader")

// system is one store under test: its command lines and its calls, each a
// single call of its raw generated gRPC stub.
type system struct {
	name string
	bin  string
	args func(i int, names, peers, clients, http []string, dataDir string) []string
	// httpOnClient: the member serves HTTP (pprof) on its client port.
	httpOnClient bool
	// leader returns the index of the member that leads.
	leader func(ctx context.Context, clients []string) (int, error)
	ops    func(conn *grpc.ClientConn) ops
}

type ops struct {
	// putBatch writes keys[i]=values[i] in one transaction.
	putBatch        func(ctx context.Context, keys, values [][]byte) error
	getLinearizable func(ctx context.Context, key []byte) ([]byte, bool, error)
	// snapshotBytes streams the system's operator snapshot and returns
	// its size.
	snapshotBytes func(ctx context.Context) (int64, error)
}

// lodestoneSystem runs `lodestone server` members with the defaults and
// pprof on, plus extra flags.
func lodestoneSystem(bin string, extra []string) system {
	return system{
		name: "lodestone",
		bin:  bin,
		args: func(i int, names, peers, clients, http []string, dataDir string) []string {
			return append([]string{"server",
				"--name", names[i],
				"--data-dir", dataDir,
				"--listen-peer", peers[i],
				"--listen-grpc", clients[i],
				"--listen-http", http[i],
				"--initial-cluster", initialCluster(names, peers),
				"--log-level", logLevel,
				"--enable-pprof",
			}, extra...)
		},
		leader: func(ctx context.Context, clients []string) (int, error) {
			var errs []error
			for i, addr := range clients {
				conn, err := dial(addr)
				if err != nil {
					return -1, err
				}
				st, err := lodestonepb.NewClusterClient(conn).Status(ctx, &lodestonepb.StatusRequest{})
				conn.Close()
				if err != nil {
					errs = append(errs, fmt.Errorf("status %s: %w", addr, err))
					continue
				}
				if st.GetLeaderId() != 0 && st.GetLeaderId() == st.GetSelf().GetId() {
					return i, nil
				}
			}
			return -1, errors.Join(append(errs, errNoLeader)...)
		},
		ops: func(conn *grpc.ClientConn) ops {
			kv := lodestonepb.NewKVClient(conn)
			return ops{
				putBatch: func(ctx context.Context, keys, values [][]byte) error {
					req := &lodestonepb.TxnRequest{}
					for i, k := range keys {
						req.Ops = append(req.Ops, &lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: k, Value: values[i]})
					}
					resp, err := kv.Txn(ctx, req)
					if err == nil && !resp.GetSucceeded() {
						err = fmt.Errorf("transaction failed: %v", resp.GetErrors())
					}
					return err
				},
				getLinearizable: func(ctx context.Context, key []byte) ([]byte, bool, error) {
					resp, err := kv.Get(ctx, &lodestonepb.GetRequest{Key: key, Consistency: lodestonepb.Consistency_LINEARIZABLE})
					return resp.GetKv().GetValue(), resp.GetKv() != nil, err
				},
				snapshotBytes: func(ctx context.Context) (int64, error) {
					st, err := lodestonepb.NewAdminClient(conn).SaveSnapshot(ctx, &lodestonepb.SaveSnapshotRequest{})
					if err != nil {
						return 0, err
					}
					return streamBytes(st.Recv, func(c *lodestonepb.SavedSnapshotChunk) int { return len(c.GetData()) })
				},
			}
		},
	}
}

// etcdSystem runs etcdnode members (embedded etcd, fsync on, its own
// defaults otherwise: a snapshot every 10,000 entries, 5,000 kept).
func etcdSystem(bin string) system {
	return system{
		name:         "etcd",
		bin:          bin,
		httpOnClient: true,
		args: func(i int, names, peers, clients, _ []string, dataDir string) []string {
			return []string{
				"--name", names[i],
				"--data-dir", dataDir,
				"--listen-peer", peers[i],
				"--listen-client", clients[i],
				"--initial-cluster", initialCluster(names, peers),
				"--log-level", logLevel,
				"--enable-pprof",
			}
		},
		leader: func(ctx context.Context, clients []string) (int, error) {
			cli, err := clientv3.New(clientv3.Config{Endpoints: clients, Logger: zap.NewNop()})
			if err != nil {
				return -1, fmt.Errorf("etcd client: %w", err)
			}
			defer cli.Close()
			var errs []error
			for i, ep := range clients {
				st, err := cli.Status(ctx, ep)
				if err != nil {
					errs = append(errs, fmt.Errorf("status %s: %w", ep, err))
					continue
				}
				if st.Leader != 0 && st.Leader == st.Header.GetMemberId() {
					return i, nil
				}
			}
			return -1, errors.Join(append(errs, errNoLeader)...)
		},
		ops: func(conn *grpc.ClientConn) ops {
			kv := etcdserverpb.NewKVClient(conn)
			return ops{
				putBatch: func(ctx context.Context, keys, values [][]byte) error {
					req := &etcdserverpb.TxnRequest{}
					for i, k := range keys {
						req.Success = append(req.Success, &etcdserverpb.RequestOp{
							Request: &etcdserverpb.RequestOp_RequestPut{RequestPut: &etcdserverpb.PutRequest{Key: k, Value: values[i]}}})
					}
					resp, err := kv.Txn(ctx, req)
					if err == nil && !resp.GetSucceeded() {
						err = errors.New("transaction failed")
					}
					return err
				},
				getLinearizable: func(ctx context.Context, key []byte) ([]byte, bool, error) {
					resp, err := kv.Range(ctx, &etcdserverpb.RangeRequest{Key: key})
					if err != nil || len(resp.GetKvs()) == 0 {
						return nil, false, err
					}
					return resp.GetKvs()[0].Value, true, nil
				},
				snapshotBytes: func(ctx context.Context) (int64, error) {
					st, err := etcdserverpb.NewMaintenanceClient(conn).Snapshot(ctx, &etcdserverpb.SnapshotRequest{})
					if err != nil {
						return 0, err
					}
					return streamBytes(st.Recv, func(r *etcdserverpb.SnapshotResponse) int { return len(r.GetBlob()) })
				},
			}
		},
	}
}

// streamBytes reads a snapshot stream to its end and counts its bytes.
func streamBytes[T any](recv func() (T, error), size func(T) int) (int64, error) {
	var n int64
	for {
		chunk, err := recv()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return 0, err
		}
		n += int64(size(chunk))
	}
}
