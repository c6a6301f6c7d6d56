# Synapse developer targets (GNU make). `make help` lists them.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

GO ?= go

# Stamped into the binary by `build` (see cmd/synapse/version.go).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)

# Packages that `make test` runs with the race detector. Add new packages
# (./protocol/... ./broker/... ./tiering/...) here as they land.
CORE_PKGS ?= ./log/... ./protocol/... ./auth/... ./broker/... ./group/... ./txn/... ./internal/... ./tiering/... ./coord/... ./cmd/...

# Fuzzing: every Fuzz* target of FUZZ_PKGS runs for FUZZTIME, one after another.
FUZZ_PKGS ?= ./log/ ./protocol/ ./group ./auth
FUZZTIME ?= 30s

# Tools live outside the clone so a fresh clone (CI) reuses them.
TOOLS_BIN ?= $(HOME)/.cache/synapse-tools/bin
# honnef.co/go/tools v0.8.2 is staticcheck 2026.2.2, which supports go1.26.
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK := $(TOOLS_BIN)/staticcheck
# etcd for the cluster tests: etcd's own server (etcdmain) built from the
# go.etcd.io/etcd/server/v3 version in go.mod.
ETCD := $(TOOLS_BIN)/etcd
ETCD_VERSION := $(shell $(GO) list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3 2>/dev/null | sed 's/^v//')

.PHONY: help run build tools lint test compat kgo-suite chaos fuzz bench bench-txn bench-cluster clean

help:
	@echo "make run     build, then bin/synapse serve (data in ./data)"
	@echo "make build   static binary bin/synapse (VERSION=$(VERSION))"
	@echo "make tools   install test tools into $(TOOLS_BIN)"
	@echo "make lint    gofmt, go vet, staticcheck"
	@echo "make test    tools + lint + go test -race $(CORE_PKGS)"
	@echo "make compat  real Kafka clients against bin/synapse (part of make test)"
	@echo "make kgo-suite  franz-go's own kgo integration tests against bin/synapse (part of make compat)"
	@echo "make chaos   long cluster fault runs: CHAOS_KILLS kill -9 and CHAOS_PAUSES SIGSTOP cycles of a leader (defaults 200, 50)"
	@echo "make fuzz    each fuzz target in $(FUZZ_PKGS) for FUZZTIME=$(FUZZTIME)"
	@echo "make bench   benchmarks"
	@echo "make bench-txn  only the bench's transactions block (TX1, TX2); TXN_ARGS=\"-rounds 2 -txn-records 200000\" for a quick look"
	@echo "make bench-cluster  only the bench's cluster block (CL1, CL2); CLUSTER_ARGS=\"-rounds 1\" for a quick look"
	@echo "make clean   remove bin/"

# Builds, then replaces make with the broker so Ctrl-C / SIGTERM reach it
# directly and a clean stop exits 0.
run: build
	exec ./bin/synapse serve

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/synapse ./cmd/synapse

# Idempotent and quiet: prints a line only when it installs something, and
# go's output only when an install fails.
tools:
	@mkdir -p "$(TOOLS_BIN)"
	@if ! "$(STATICCHECK)" -version 2>/dev/null | grep -qF "($(STATICCHECK_VERSION:v%=%))"; then \
		echo "installing staticcheck $(STATICCHECK_VERSION) into $(TOOLS_BIN)"; \
		out=$$(GOBIN="$(TOOLS_BIN)" $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) 2>&1) \
			|| { echo "$$out"; exit 1; }; \
	fi
	@# Debian packages for the script compat tests (kcat, kafka-python,
	@# confluent-kafka python), installed only when missing.
	@bash compat-tests/install-deps.sh
	@# KafkaJS (npm) for the KafkaJS compat test.
	@bash compat-tests/install-kafkajs.sh
	@# versitygw v1.8.0, the S3-compatible server the tiering tests start.
	@TOOLS_BIN="$(TOOLS_BIN)" bash tiering/install-versitygw.sh
	@# etcd's own server at the version go.mod pins, for the cluster tests.
	@if ! "$(ETCD)" --version 2>/dev/null | grep -qF "$(ETCD_VERSION)"; then \
		echo "building etcd $(ETCD_VERSION) into $(TOOLS_BIN)"; \
		CGO_ENABLED=0 $(GO) build -o "$(ETCD)" ./internal/tools/etcd; \
	fi

lint: tools
	@unformatted=$$(find . -path ./.git -prune -o -path '*/testdata' -prune -o -name '*.go' -print | xargs -r gofmt -l); \
	if [ -n "$$unformatted" ]; then echo "gofmt -w needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	@# The binary also builds elsewhere (docs/operations.md: vetted, not tested there).
	GOOS=darwin $(GO) vet ./...
	"$(STATICCHECK)" ./...
	cd compat-tests && $(GO) vet ./... && "$(STATICCHECK)" ./...
	cd bench && $(GO) vet ./... && "$(STATICCHECK)" ./...

# TIERING_REQUIRE_S3=1: the tiering tests fail (not skip) without versitygw.
test: tools lint
	TIERING_REQUIRE_S3=1 VERSITYGW_BIN="$(TOOLS_BIN)/versitygw" $(GO) test -race -count=1 $(CORE_PKGS)
	$(MAKE) --no-print-directory compat

# Real clients (franz-go, sarama, kafka-go, confluent-kafka-go, kcat,
# kafka-python) against a real `synapse serve` process; see compat-tests/.
compat: build
	cd compat-tests && COMPAT_REQUIRE=1 SYNAPSE_BIN=$(CURDIR)/bin/synapse ETCD_BIN=$(ETCD) VERSITYGW_BIN=$(TOOLS_BIN)/versitygw $(GO) test -count=1 -timeout 15m ./...
	$(MAKE) --no-print-directory kgo-suite

# franz-go's own pkg/kgo integration tests (SASL, plaintext, TLS) against one
# bin/synapse, as franz-go's CI runs them; see compat-tests/kgo-suite.sh.
kgo-suite: build
	SYNAPSE_BIN=$(CURDIR)/bin/synapse GO=$(GO) bash compat-tests/kgo-suite.sh

# Long cluster fault runs (not in make test): kill -9 and SIGSTOP of a
# leader under load, every acknowledged record read back; failover times
# printed (docs/cluster.md has the figures).
CHAOS_KILLS ?= 200
CHAOS_PAUSES ?= 50
chaos: build tools
	cd compat-tests && COMPAT_REQUIRE=1 SYNAPSE_BIN=$(CURDIR)/bin/synapse ETCD_BIN=$(ETCD) \
		CLUSTER_CHAOS_KILLS=$(CHAOS_KILLS) CLUSTER_CHAOS_PAUSES=$(CHAOS_PAUSES) \
		$(GO) test -count=1 -timeout 120m -run '^TestClusterChaos$$' -v ./ 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok)|cluster_chaos_test'

fuzz:
	@for pkg in $(FUZZ_PKGS); do \
		for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "== $$pkg $$t ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; \
	done

# Ratios against baselines measured in the same run; see docs/benchmarks.md.
BENCH_ARGS ?=
# e.g. SIDE_BY_SIDE_ARGS="-rounds 1 -p1-records 200000 -e2e-duration 5s" for a quick look
# (it includes the transactions block, TX1 and TX2: -txn-rounds 0 skips it).
SIDE_BY_SIDE_ARGS ?=
# Scale block (bench/runner/scale.go): partition counts, e.g. SCALE_PARTITIONS=1000,10000; SCALE_ARGS="-scale-kfake=false".
SCALE_PARTITIONS ?= 1000,10000,100000
SCALE_ARGS ?=
bench: build tools
	cd bench && $(GO) build -o $(CURDIR)/bin/kfake ./kfake
	cd bench && $(GO) run ./runner -synapse $(CURDIR)/bin/synapse -kfake $(CURDIR)/bin/kfake -etcd $(ETCD) $(SIDE_BY_SIDE_ARGS)
	cd bench && $(GO) run ./runner -synapse $(CURDIR)/bin/synapse -kfake $(CURDIR)/bin/kfake -scale-only -scale $(SCALE_PARTITIONS) $(SCALE_ARGS)
	./bin/synapse bench log $(BENCH_ARGS)
	@# Flush what the runs above left dirty, so its writeback does not run during the tiering benchmarks.
	sync
	cd tiering && TIERING_REQUIRE_S3=1 VERSITYGW_BIN="$(TOOLS_BIN)/versitygw" SYNAPSE_BIN=$(CURDIR)/bin/synapse \
		$(GO) test -run '^$$' -bench 'ColdCatchUp|UploadKeepsUp|TailLatency' -benchtime 3x .
	@# The cold catch-up again with the broker on a CPU of its own (S3 server and clients on the other one).
	if taskset -c 0 true 2>/dev/null && taskset -c 1 true 2>/dev/null; then \
		cd tiering && PIN_BROKER=0 TIERING_REQUIRE_S3=1 VERSITYGW_BIN="$(TOOLS_BIN)/versitygw" SYNAPSE_BIN=$(CURDIR)/bin/synapse \
		taskset -c 1 $(GO) test -run '^$$' -bench 'ColdCatchUp' -benchtime 3x .; fi

# Only the transactions block of the side by side (bench/runner/txn.go), e.g. TXN_ARGS="-rounds 2 -txn-records 200000".
TXN_ARGS ?=
bench-txn: build
	cd bench && $(GO) build -o $(CURDIR)/bin/kfake ./kfake
	cd bench && $(GO) run ./runner -synapse $(CURDIR)/bin/synapse -kfake $(CURDIR)/bin/kfake -txn-only $(TXN_ARGS)

bench-cluster: build tools
	cd bench && $(GO) build -o $(CURDIR)/bin/kfake ./kfake
	cd bench && $(GO) run ./runner -synapse $(CURDIR)/bin/synapse -kfake $(CURDIR)/bin/kfake -etcd $(ETCD) -cluster-only $(CLUSTER_ARGS)

clean:
	rm -rf bin/
