#!/usr/bin/env bash
# Installs versitygw (the S3-compatible server the tiering tests run on
# loopback) into a tools cache outside the clone, once. Idempotent and quiet:
# it prints nothing when the pinned version is already there.
#
#   TOOLS_BIN   where to install (default $HOME/.cache/synapse-tools/bin)
#
# `go install` leaves main.Version at "git", so the version is stamped with
# -ldflags (as versitygw's own Makefile does) and checked with
# `versitygw --version`; `go version -m` is accepted too.
set -euo pipefail

VERSION=v1.8.0
MODULE=github.com/versity/versitygw
TOOLS_BIN=${TOOLS_BIN:-$HOME/.cache/synapse-tools/bin}
BIN=$TOOLS_BIN/versitygw

installed() {
	[ -x "$BIN" ] || return 1
	"$BIN" --version 2>/dev/null | grep -q "Version *: *$VERSION\$" && return 0
	go version -m "$BIN" 2>/dev/null | grep -qE "^[[:space:]]+mod[[:space:]]+$MODULE[[:space:]]+$VERSION([[:space:]]|\$)"
}

if installed; then
	exit 0
fi

mkdir -p "$TOOLS_BIN"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! GOBIN=$TOOLS_BIN CGO_ENABLED=0 go install \
	-ldflags "-X=main.Version=$VERSION -X=main.Build=go-install" \
	"$MODULE/cmd/versitygw@$VERSION" >"$log" 2>&1; then
	cat "$log" >&2
	echo "install-versitygw: go install $MODULE/cmd/versitygw@$VERSION failed" >&2
	exit 1
fi
if ! installed; then
	echo "install-versitygw: $BIN does not report $VERSION after install" >&2
	exit 1
fi
