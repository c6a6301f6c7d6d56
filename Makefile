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
CORE_PKGS ?= ./log/... ./protocol/... ./broker/... ./cmd/...

# Fuzzing: every Fuzz* target of FUZZ_PKG runs for FUZZTIME, one after another.
FUZZ_PKG ?= ./log/
FUZZTIME ?= 30s

# Tools live outside the clone so a fresh clone (CI) reuses them.
TOOLS_BIN ?= $(HOME)/.cache/synapse-tools/bin
# honnef.co/go/tools v0.8.2 is staticcheck 2026.2.2, which supports go1.26.
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK := $(TOOLS_BIN)/staticcheck

.PHONY: help run build tools lint test fuzz bench clean

help:
	@echo "make run     build, then bin/synapse serve (data in ./data)"
	@echo "make build   static binary bin/synapse (VERSION=$(VERSION))"
	@echo "make tools   install test tools into $(TOOLS_BIN)"
	@echo "make lint    gofmt, go vet, staticcheck"
	@echo "make test    tools + lint + go test -race $(CORE_PKGS)"
	@echo "make fuzz    each fuzz target in $(FUZZ_PKG) for FUZZTIME=$(FUZZTIME)"
	@echo "make bench   benchmarks"
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
	@# ---- later tools go here, each installed only when missing ----------
	@# - versitygw (S3-compatible server) for the tiering tests
	@# - apt packages (kcat, python3-kafka, ...) for compat-tests
	@# ---------------------------------------------------------------------

lint: tools
	@unformatted=$$(find . -path ./.git -prune -o -path '*/testdata' -prune -o -name '*.go' -print | xargs -r gofmt -l); \
	if [ -n "$$unformatted" ]; then echo "gofmt -w needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	"$(STATICCHECK)" ./...

test: tools lint
	$(GO) test -race -count=1 $(CORE_PKGS)

fuzz:
	@targets=$$($(GO) test -list '^Fuzz' $(FUZZ_PKG) | grep '^Fuzz' || true); \
	if [ -z "$$targets" ]; then echo "no fuzz targets in $(FUZZ_PKG)"; exit 0; fi; \
	for t in $$targets; do \
		echo "== $$t ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $(FUZZ_PKG); \
	done

# Ratios against baselines measured in the same run; see README.md.
BENCH_ARGS ?=
bench: build
	./bin/synapse bench log $(BENCH_ARGS)

clean:
	rm -rf bin/
