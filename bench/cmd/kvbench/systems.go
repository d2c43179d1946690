package main

import (
	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/internal/token"

	"context"
	"errors"
	"fmt"
	"slices"
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

// secureSuffix names a system's secure variant (TLS with client
// certificates everywhere, access control on): "lodestone-secure".
const secureSuffix = "-secure"

var errNoLeader = errors.New("no member reports itself leader")

func initialCluster(names, peers []string) string {
	var parts []string
	for i := range names {
		parts = append(parts, names[i]+"="+peers[i])
	}
	return strings.Join(parts, ",")
}

// lodestoneSystem runs `lodestone server` members and talks to them with the
// raw generated gRPC API. With sec, every port serves TLS and requires a
// client certificate (gRPC and HTTP by flag; the peer port always does with
// TLS on), ACLs are on with default deny, and the bench writes with a token
// whose only rule is key_prefix "kvbench/" { policy = "write" }.
func lodestoneSystem(bin string, sec *secureFiles) system {
	name := "lodestone"
	if sec != nil {
		name += secureSuffix
	}
	return system{
		name:       name,
		sec:        sec,
		profiles:   true,
		readRounds: true,
		// client/ dials with fixed flow-control windows; clientv3 keeps
		// gRPC's defaults (bandwidth estimation on).
		dialOptions: grpcopt.DialOptions(),
		bin:         bin,
		args: func(i int, names, peers, clients, http []string, dataDir string) []string {
			args := []string{"server",
				"--name", names[i],
				"--data-dir", dataDir,
				"--listen-peer", peers[i],
				"--listen-grpc", clients[i],
				"--listen-http", http[i],
				"--initial-cluster", initialCluster(names, peers),
				"--log-level", logLevel,
			}
			if *flagPprof != "" {
				args = append(args, "--enable-pprof")
			}
			if sec != nil {
				args = append(args,
					"--tls-ca-file", sec.ca,
					"--tls-cert-file", sec.cert[names[i]],
					"--tls-key-file", sec.key[names[i]],
					"--tls-verify-incoming-grpc",
					"--tls-verify-incoming-http",
					"--acl-enabled",
					"--acl-default-policy", "deny",
				)
			}
			return args
		},
		prepare: func(ctx context.Context, c *cluster) error {
			if sec == nil {
				return nil
			}
			secret, mgmt, err := lodestoneACL(ctx, sec, c.http[slices.Index(c.clients, c.leader)])
			if err != nil {
				return err
			}
			c.token = secret
			c.connOptions = append(c.connOptions, grpc.WithPerRPCCredentials(token.PerRPC(secret)))
			c.mgmtToken = mgmt
			return nil
		},
		leader: func(ctx context.Context, sys system, clients []string) (string, error) {
			var errs []error
			for _, addr := range clients {
				conn, err := sys.dial(addr)
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
		// NB: every op goes through the Go client Lodestone's users run
		// (one per bench connection: the client dials it), retry layer
		// and all, and the client coalesces concurrent Gets into one
		// GetMany (client.Config.GetBatch).
		ops: func(_ context.Context, c *cluster) (connOps, error) {
			cfg := client.Config{
				Endpoints:   []string{c.leader},
				Token:       c.token,
				DialOptions: slices.Clone(c.sys.dialOptions),
			}
			if c.sys.sec != nil {
				cfg.TLS = c.sys.sec.client
			}
			cl, err := client.New(cfg)
			if err != nil {
				return connOps{}, err
			}
			return connOps{
				close: func() { cl.Close() },
				put: func(ctx context.Context, key, value []byte) error {
					_, err := cl.Put(ctx, string(key), value)
					return err
				},
				putBatch: func(ctx context.Context, keys [][]byte, value []byte) error {
					var ops []*lodestonepb.TxnOp
					for _, k := range keys {
						ops = append(ops, &lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: k, Value: value})
					}
					resp, err := cl.Txn(ctx, ops)
					if err == nil && !resp.GetSucceeded() {
						err = fmt.Errorf("transaction failed: %v", resp.GetErrors())
					}
					return err
				},
				get: func(ctx context.Context, key []byte, stale bool) ([]byte, bool, error) {
					var opts []client.ReadOption
					if stale {
						opts = append(opts, client.Stale())
					}
					resp, err := cl.Get(ctx, string(key), opts...)
					return resp.GetKv().GetValue(), resp.GetKv() != nil, err
				},
				rangeKeys: func(ctx context.Context, prefix []byte, limit int) (int, error) {
					resp, err := cl.Range(ctx, string(prefix), client.Limit(uint32(limit)))
					return len(resp.GetKvs()), err
				},
			}, nil
		},
		stubPut: func(conn *grpc.ClientConn) func(ctx context.Context, key, value []byte) error {
			kv := lodestonepb.NewKVClient(conn)
			return func(ctx context.Context, key, value []byte) error {
				_, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: key, Value: value})
				return err
			}
		},
	}
}

// etcdSystem runs etcdnode members (embedded etcd, fsync on). Leader
// discovery uses clientv3's Status; every op is a call of etcd's raw
// generated KV stub on a bench connection, which costs the load generator
// less than clientv3's retry and balancing layers (Lodestone's ops pay
// for its client's). With sec,
// the client and peer ports serve TLS and require a client certificate,
// the client port serves gRPC only (HTTP on the spare port: etcd's
// recommended layout, without which it serves TLS gRPC through net/http),
// auth is enabled with a root user, and each bench connection logs in as a
// user whose role has readwrite on the bench prefix.
func etcdSystem(bin string, sec *secureFiles) system {
	name := "etcd"
	if sec != nil {
		name += secureSuffix
	}
	return system{
		name: name,
		sec:  sec,
		bin:  bin,
		args: func(i int, names, peers, clients, http []string, dataDir string) []string {
			args := []string{
				"--name", names[i],
				"--data-dir", dataDir,
				"--listen-peer", peers[i],
				"--listen-client", clients[i],
				"--initial-cluster", initialCluster(names, peers),
				"--log-level", logLevel,
			}
			if sec != nil {
				args = append(args,
					"--listen-client-http", http[i],
					"--tls-ca-file", sec.ca,
					"--tls-cert-file", sec.cert[names[i]],
					"--tls-key-file", sec.key[names[i]],
					"--tls-verify-incoming",
				)
			}
			return args
		},
		prepare: func(ctx context.Context, c *cluster) error {
			if sec == nil {
				return nil
			}
			return etcdAuth(ctx, sec, "https://"+c.leader)
		},
		login: func(ctx context.Context, sys system, addr string) (*grpc.ClientConn, error) {
			if sec == nil {
				return sys.dial(addr)
			}
			return etcdLogin(ctx, sys, addr)
		},
		leader: func(ctx context.Context, sys system, clients []string) (string, error) {
			cfg := clientv3.Config{Endpoints: clients, Logger: zap.NewNop()}
			if sec != nil {
				// Status needs a user once auth is on; root's login is
				// skipped while it is still off.
				cfg.TLS, cfg.Username, cfg.Password = sec.client, etcdRootUser, etcdRootPass
				cfg.Endpoints = nil
				for _, ep := range clients {
					cfg.Endpoints = append(cfg.Endpoints, "https://"+ep)
				}
			}
			cli, err := clientv3.New(cfg)
			if err != nil {
				return "", fmt.Errorf("etcd client: %w", err)
			}
			defer cli.Close()
			var errs []error
			for i, ep := range cfg.Endpoints {
				st, err := cli.Status(ctx, ep)
				if err != nil {
					errs = append(errs, fmt.Errorf("status %s: %w", ep, err))
					continue
				}
				if st.Leader != 0 && st.Leader == st.Header.GetMemberId() {
					return clients[i], nil
				}
			}
			return "", errors.Join(append(errs, errNoLeader)...)
		},
		ops: func(ctx context.Context, c *cluster) (connOps, error) {
			conn, err := c.connect(ctx, c.leader)
			if err != nil {
				return connOps{}, err
			}
			kv := etcdserverpb.NewKVClient(conn)
			return connOps{
				put: etcdPut(conn),
				putBatch: func(ctx context.Context, keys [][]byte, value []byte) error {
					req := &etcdserverpb.TxnRequest{}
					for _, k := range keys {
						req.Success = append(req.Success, &etcdserverpb.RequestOp{
							Request: &etcdserverpb.RequestOp_RequestPut{RequestPut: &etcdserverpb.PutRequest{Key: k, Value: value}}})
					}
					resp, err := kv.Txn(ctx, req)
					if err == nil && !resp.GetSucceeded() {
						err = errors.New("transaction failed")
					}
					return err
				},
				get: func(ctx context.Context, key []byte, stale bool) ([]byte, bool, error) {
					resp, err := kv.Range(ctx, &etcdserverpb.RangeRequest{Key: key, Serializable: stale})
					if err != nil || len(resp.GetKvs()) == 0 {
						return nil, false, err
					}
					return resp.GetKvs()[0].Value, true, nil
				},
				rangeKeys: func(ctx context.Context, prefix []byte, limit int) (int, error) {
					resp, err := kv.Range(ctx, &etcdserverpb.RangeRequest{
						Key: prefix, RangeEnd: []byte(clientv3.GetPrefixRangeEnd(string(prefix))), Limit: int64(limit)})
					return len(resp.GetKvs()), err
				},
				close: func() { conn.Close() },
			}, nil
		},
		stubPut: etcdPut,
	}
}

func etcdPut(conn *grpc.ClientConn) func(ctx context.Context, key, value []byte) error {
	kv := etcdserverpb.NewKVClient(conn)
	return func(ctx context.Context, key, value []byte) error {
		_, err := kv.Put(ctx, &etcdserverpb.PutRequest{Key: key, Value: value})
		return err
	}
}
