# Lodestone. `make dev` runs a single-node registry; `make test` runs the suite.
GO        ?= go
BIN       ?= bin
GOFLAGS   ?= -buildvcs=false
export GOFLAGS

# What the binary says it is (lodestone version, lodestone_build_info, the
# image's labels). The date is the commit's, so a rebuild of one commit is
# the same binary.
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT     ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILD_DATE ?= $(shell git log -1 --format=%cI 2>/dev/null || echo unknown)
BUILDINFO  = github.com/lodestone-kv/lodestone/internal/buildinfo
LDFLAGS    = -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).commit=$(COMMIT) -X $(BUILDINFO).date=$(BUILD_DATE)

.PHONY: all build dev test test-short vet proto bench bench-kv clean

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/lodestone ./cmd/lodestone

dev:
	$(GO) run ./cmd/lodestone dev

# The full suite, race detector on. This is what CI runs.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 14m ./...
	cd bench && $(GO) vet ./... && $(GO) test -count=1 -timeout 5m ./...
	cd deploy && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 15m ./...
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) chaos-smoke; \
	else echo "chaos-smoke not run: it needs root for network namespaces (CI runs it)"; fi

test-short:
	$(GO) test -count=1 -short ./...

# Jepsen-style campaigns against a real cluster in network namespaces
# (chaos/README.md). Need root, iproute2 and iptables. Each writes
# chaos/runs/<id>/ and ends with `CHAOS ops=<n> faults=<n> anomalies=<n>`;
# the exit code is non-zero on any anomaly. chaos-smoke takes about 60 s
# (3 nodes, two faults of each kind); chaos runs 10 minutes (each kind 22x).
# Both run the cluster with TLS and ACLs (bin/chaos --plaintext: without).
# The worst-day drill (tools/drill): a 3-node cluster with 1,000 watchers and
# 2,000 clients loses every node, restarts, and every client reconnects at
# once, with an admission ramp and without. Prints DRILL lines.
.PHONY: drill
drill: build
	$(GO) run ./tools/drill --binary $(BIN)/lodestone

.PHONY: chaos chaos-smoke
chaos: build
	$(GO) build -o $(BIN)/chaos ./chaos
	$(BIN)/chaos --binary $(CURDIR)/$(BIN)/lodestone

chaos-smoke: build
	$(GO) build -o $(BIN)/chaos ./chaos
	$(BIN)/chaos --smoke --binary $(CURDIR)/$(BIN)/lodestone

vet:
	$(GO) vet ./...

# Fuzzing: every target below runs for FUZZTIME, one after another
# (`make fuzz FUZZTIME=5m`). Their seed corpora (f.Add and
# testdata/fuzz/<Target>/) already run with every `go test`, so CI checks
# the seeds; this explores beyond them. A crash is written to
# <pkg>/testdata/fuzz/<Target>/: commit it with the fix. Minimizing each
# new input is capped at FUZZMINIMIZETIME (runs) so minimizing does not eat
# a short run. The one list of targets, as <package dir>:<Target>:
FUZZTIME         ?= 30s
FUZZMINIMIZETIME ?= 10x
FUZZ_TARGETS = \
	raftlog:FuzzEntryRecord \
	raftlog:FuzzMetaRecord \
	raftlog:FuzzJournalPayload \
	raftlog:FuzzJournalReplay \
	store:FuzzApply \
	store:FuzzRestore \
	store:FuzzVerifySnapshot \
	tools/snapshot:FuzzInspect \
	peer:FuzzRaftStreamPreamble \
	peer:FuzzRaftStreamFrames \
	server/httppark:FuzzNextRequest \
	gateway/internal/h1:FuzzParseRequest \
	gateway/internal/h1:FuzzParseResponse \
	server/consulapi:FuzzWriteBodies \
	server/consulapi:FuzzKVEntryJSON \
	server/consulapi:FuzzParams \
	acl:FuzzParseRules \
	internal/clusterid:FuzzParse

.PHONY: fuzz fuzz-list
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=./$${t%%:*}; name=$${t##*:}; \
		echo "== $$name in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) \
			-fuzzminimizetime=$(FUZZMINIMIZETIME) $$pkg; \
	done

fuzz-list:
	@for t in $(FUZZ_TARGETS); do echo $$t; done

# Known vulnerabilities in the modules and the standard library the code
# reaches. Needs govulncheck (go install golang.org/x/vuln/cmd/govulncheck@latest)
# and network access to its database, https://vuln.go.dev; not part of
# `make test` because CI machines may not reach it.
GOVULNCHECK ?= govulncheck
.PHONY: vulncheck
vulncheck:
	$(GOVULNCHECK) ./...
	cd bench && $(GOVULNCHECK) ./...

# Regenerates api/lodestonepb from the .proto files. Needs protoc
# (Debian: protobuf-compiler) and the Go plugins:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
proto:
	./api/gen.sh

# Side-by-side benchmarks against named peers; each prints BENCH lines.
bench: bench-kv bench-blocking

bench-kv:
	cd bench && $(GO) run ./cmd/kvbench

# Gateway vs nginx, HAProxy and httputil.ReverseProxy under wrk (needs wrk,
# nginx-light and haproxy from apt); see bench/cmd/gatewaybench.
bench-gateway:
	cd bench && $(GO) run ./cmd/gatewaybench

# Raft log append latency on a fresh and a Roblox-shaped (bloated) file:
# Lodestone's raftlog vs raft-boltdb v1/v2 and raft-wal, plus online rotation.
bench-raftlog:
	cd bench && $(GO) run ./cmd/raftlogbench

# Watch fan-out: Lodestone vs etcd vs a single-channel broadcaster, 0/10k/100k watchers.
.PHONY: bench-watch
bench-watch:
	cd bench && $(GO) run ./cmd/watchbench

# 10k Consul-style blocking queries on distinct keys plus 1,000 writes/s
# through the Consul HTTP KV API: write p99 with them vs without, every
# query answered; see bench/cmd/blockingbench.
.PHONY: bench-blocking
bench-blocking:
	cd bench && $(GO) run ./cmd/blockingbench

# Service lookups over DNS: Lodestone's DNS interface vs unbound serving the
# same records from a static zone, each on one core (needs unbound from apt);
# see bench/cmd/dnsbench.
.PHONY: bench-dns
bench-dns:
	cd bench && $(GO) run ./cmd/dnsbench

clean:
	rm -rf $(BIN)
