# Lodestone. `make dev` runs a single-node registry; `make test` runs the suite.
GO        ?= go
BIN       ?= bin
GOFLAGS   ?= -buildvcs=false
export GOFLAGS

.PHONY: all build dev test test-short vet proto bench bench-kv clean

all: build

build:
	$(GO) build -o $(BIN)/lodestone ./cmd/lodestone

dev:
	$(GO) run ./cmd/lodestone dev

# The full suite, race detector on. This is what CI runs.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 14m ./...
	cd bench && $(GO) test -count=1 -timeout 5m ./internal/...

test-short:
	$(GO) test -count=1 -short ./...

vet:
	$(GO) vet ./...

# Regenerates api/lodestonepb from the .proto files. Needs protoc
# (Debian: protobuf-compiler) and the Go plugins:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
proto:
	./api/gen.sh

# Side-by-side benchmarks against named peers; each prints BENCH lines.
bench: bench-kv

bench-kv:
	cd bench && $(GO) run ./cmd/kvbench

clean:
	rm -rf $(BIN)
