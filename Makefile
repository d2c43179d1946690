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

# Release binaries: static (no cgo), without local paths (-trimpath) or
# debug symbols (-s -w), stamped as build stamps them, one per platform as
# dist/lodestone_<version>_<os>_<arch>, and dist/SHA256SUMS beside them
# (cd dist && sha256sum -c SHA256SUMS). dist/ is rebuilt from scratch.
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64
.PHONY: release
release:
	rm -rf dist && mkdir dist
	@set -e; for p in $(RELEASE_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=dist/lodestone_$(VERSION)_$${os}_$${arch}; \
		echo "== $$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS) -s -w' -o $$out ./cmd/lodestone; \
	done
	cd dist && sha256sum lodestone_* > SHA256SUMS

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
# once, with an admission ramp and without, 3 reps each (DRILL_FLAGS, e.g.
# -reps 5 -pprof DIR; go run ./tools/drill -h). The servers run on CPU 1,
# the clients and watchers in a child process on CPU 0, the drill's own
# clock and scrapes unpinned (-drill-cpus). Prints DRILL lines per rep
# and a summary with medians and spreads. Takes about 10-20 minutes.
DRILL_FLAGS ?=
.PHONY: drill
drill: build
	$(GO) run ./tools/drill --binary $(BIN)/lodestone $(DRILL_FLAGS)

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

# The Consul HTTP API, Lodestone vs Consul v1.16.3 (the last MPL-2.0
# release, built once from the Go module proxy into ~/.cache/lodestone-bench;
# a cold build takes minutes and 2 GB): KV puts and default-mode gets at 64
# connections, catalog registrations; see bench/cmd/consulbench.
.PHONY: bench-consul
bench-consul:
	cd bench && $(GO) run ./cmd/consulbench

# Every web UI page against a real server with 10,000 keys and 1,000 service
# instances: five runs of 200 requests a page, each run's p99, and the median
# of the five printed as BENCH ui-page-p99 <page>=<ms> (target: under 50 ms).
.PHONY: bench-ui
bench-ui:
	$(GO) test -run '^$$' -bench BenchmarkUIPages -benchtime 200x -count 5 ./server/ui/ | tee /dev/stderr | \
	awk '/^BenchmarkUIPages\// { split($$1, a, "/"); page = substr($$1, length(a[1]) + 2); sub(/-[0-9]+$$/, "", page); \
		for (i = 2; i < NF; i++) if ($$(i+1) == "p99-ms") v[page] = v[page] " " $$i } \
	END { for (p in v) { m = split(substr(v[p], 2), xs, " "); \
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (xs[j] + 0 < xs[i] + 0) { t = xs[i]; xs[i] = xs[j]; xs[j] = t } \
		printf "BENCH ui-page-p99 %s=%s\n", p, xs[int((m + 1) / 2)] } }' | sort

# Gateway vs nginx and HAProxy under wrk: small, 64 KiB and new-connection
# requests, and small ones under registry churn (needs wrk, nginx-light and
# haproxy from apt); see bench/cmd/gatewaybench.
bench-gateway:
	cd bench && $(GO) run ./cmd/gatewaybench

# Raft log append latency on a fresh and a Roblox-shaped (bloated) file:
# Lodestone's raftlog vs raft-boltdb v1/v2 and raft-wal, plus online rotation.
bench-raftlog:
	cd bench && $(GO) run ./cmd/raftlogbench

# Watch fan-out: Lodestone vs etcd vs a single-channel broadcaster, 0/10k/100k watchers.
.PHONY: bench-watch
bench-watch:
	cd bench && $(GO) run ./cmd/watchbench $(WATCHBENCH_FLAGS)

# The same at 1,000,000 exact watchers over 10,000 streams (20 connections,
# so no connection reaches the server's 100k-watch limit), Lodestone alone;
# see bench/cmd/watchbench/README.md, "The 1M phase".
.PHONY: bench-watch-1m
bench-watch-1m:
	cd bench && $(GO) run ./cmd/watchbench -systems lodestone -watchers 1000000 -streams 10000 -conns 20 -gc-before-phase=false $(WATCHBENCH_FLAGS)

# 10k Consul-style blocking queries on distinct keys plus 1,000 writes/s
# through the Consul HTTP KV API: write p99 with them vs without, every
# query answered, and the same load on Consul v1.16.3 (built as for
# bench-consul): write p99 and memory per parked query vs Consul's; see
# bench/cmd/blockingbench.
.PHONY: bench-blocking
bench-blocking:
	cd bench && $(GO) run ./cmd/blockingbench $(BLOCKINGBENCH_FLAGS)

# The same at 50,000 queries: over four learners (12,500 each) and all three
# Consul servers, from query processes of 12,500 each, so that no process
# needs more than 20,000 open files; see bench/cmd/blockingbench, "50,000
# queries". BLOCKINGBENCH_FLAGS="-reps 1" for one rep.
.PHONY: bench-blocking-50k
bench-blocking-50k:
	cd bench && $(GO) run ./cmd/blockingbench -queries 50000 $(BLOCKINGBENCH_FLAGS)

# Memory and restart at scale: 1,000,000 keys of 256 B in a 3-member
# Lodestone and a 3-member etcd (RSS per member, snapshot size, restart of
# one member and of all three to a linearizable read), then a Lodestone
# catalog of 10,000 nodes and 100,000 instances; see bench/cmd/scalebench.
.PHONY: bench-scale
bench-scale:
	cd bench && $(GO) run ./cmd/scalebench

# Service lookups over DNS: Lodestone's DNS interface vs unbound serving the
# same records from a static zone, each on one core (needs unbound from apt);
# see bench/cmd/dnsbench.
.PHONY: bench-dns
bench-dns:
	cd bench && $(GO) run ./cmd/dnsbench

clean:
	rm -rf $(BIN) dist

# ---- Container image and compose cluster (deploy/image, deploy/compose) ----
# `make image` builds a static binary into $(IMAGE_CONTEXT) and an image
# FROM scratch from it, tagged $(IMAGE):$(IMAGE_TAG) and $(IMAGE):latest,
# and fails if the image is $(IMAGE_MAX_MB) MB or more. Needs docker;
# pulls nothing.
IMAGE         ?= lodestone
IMAGE_TAG     ?= $(subst +,-,$(VERSION))
IMAGE_SOURCE  ?= github.com/lodestone-kv/lodestone
IMAGE_MAX_MB  ?= 40
IMAGE_CONTEXT ?= $(BIN)/image
CA_BUNDLE     ?= /etc/ssl/certs/ca-certificates.crt
DOCKER        ?= docker

.PHONY: image
image:
	@test -r $(CA_BUNDLE) || { echo "$(CA_BUNDLE) missing: install ca-certificates or set CA_BUNDLE" >&2; exit 1; }
	rm -rf $(IMAGE_CONTEXT) && mkdir -p $(IMAGE_CONTEXT)/data
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS) -s -w' -o $(IMAGE_CONTEXT)/lodestone ./cmd/lodestone
	cp $(CA_BUNDLE) $(IMAGE_CONTEXT)/ca-certificates.crt
	cp deploy/image/Dockerfile deploy/image/passwd deploy/image/group $(IMAGE_CONTEXT)/
	$(DOCKER) build -t $(IMAGE):$(IMAGE_TAG) -t $(IMAGE):latest \
		--build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) \
		--build-arg BUILD_DATE=$(BUILD_DATE) --build-arg SOURCE=$(IMAGE_SOURCE) $(IMAGE_CONTEXT)
	@size=$$($(DOCKER) image inspect -f '{{.Size}}' $(IMAGE):$(IMAGE_TAG)) && \
	echo "IMAGE $(IMAGE):$(IMAGE_TAG) size=$$size bytes ($$((size / 1000000)) MB, limit $(IMAGE_MAX_MB) MB)" && \
	if [ "$$size" -ge $$(($(IMAGE_MAX_MB) * 1000000)) ]; then \
		echo "image $(IMAGE):$(IMAGE_TAG) is over $(IMAGE_MAX_MB) MB" >&2; exit 1; fi

# `make compose-up` runs deploy/compose: three servers (mTLS, ACLs default
# deny), two agents with demo services and a gateway, with certificates,
# the gossip key and tokens created under $(COMPOSE_SECRETS) (builds the
# image first if it is missing). `make compose-down` removes the cluster,
# its volumes and those files. See deploy/compose/README.md.
COMPOSE_PROJECT ?= lodestone
COMPOSE_IMAGE   ?= $(IMAGE):latest
COMPOSE_SECRETS ?= $(CURDIR)/deploy/compose/secrets/$(COMPOSE_PROJECT)
DOCKER_COMPOSE  ?= docker-compose
COMPOSE_FILE_    = deploy/compose/docker-compose.yml

.PHONY: compose-up compose-down
compose-up compose-down: export COMPOSE_PROJECT_NAME = $(COMPOSE_PROJECT)
compose-up compose-down: export LODESTONE_IMAGE = $(COMPOSE_IMAGE)
compose-up compose-down: export LODESTONE_SECRETS = $(COMPOSE_SECRETS)
compose-up compose-down: export DOCKER_COMPOSE := $(DOCKER_COMPOSE)

compose-up:
	@$(DOCKER) image inspect $(COMPOSE_IMAGE) >/dev/null 2>&1 && test -x $(IMAGE_CONTEXT)/lodestone || $(MAKE) image
	LODESTONE_CLI=$(CURDIR)/$(IMAGE_CONTEXT)/lodestone deploy/compose/up.sh

# NB: the compose file names the gossip key's env file, which must exist
# for any docker-compose command, down included.
compose-down:
	mkdir -p $(COMPOSE_SECRETS) && touch $(COMPOSE_SECRETS)/gossip.env
	$(DOCKER_COMPOSE) -f $(COMPOSE_FILE_) down --volumes --remove-orphans --timeout 5
	rm -rf $(COMPOSE_SECRETS)
