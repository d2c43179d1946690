#!/usr/bin/env bash
# Regenerates the Go code from the .proto files (make proto).
# NB: the files live under lodestone/v1/ so their registered names do not
# collide with etcd's raftpb, which registers a file named "raft.proto".
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$(go env GOPATH)/bin:$PATH"
protoc -I . \
  --go_out=. --go_opt=module=github.com/lodestone-kv/lodestone/api \
  --go-grpc_out=. --go-grpc_opt=module=github.com/lodestone-kv/lodestone/api \
  lodestone/v1/kv.proto lodestone/v1/cluster.proto lodestone/v1/peer.proto lodestone/v1/watch.proto \
  lodestone/v1/catalog.proto lodestone/v1/admin.proto
