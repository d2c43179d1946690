#!/usr/bin/env bash
# Regenerates the Go code from the .proto files (make proto).
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$(go env GOPATH)/bin:$PATH"
protoc -I . --go_out=lodestonepb --go_opt=paths=source_relative \
  --go-grpc_out=lodestonepb --go-grpc_opt=paths=source_relative \
  kv.proto cluster.proto raft.proto
