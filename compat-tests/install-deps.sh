#!/usr/bin/env bash
# Installs what the compat tests need beyond Go, from Debian's packages:
#   kcat                     kcat_test.go
#   python3-kafka            kafkapython_test.go (kafka-python 2.0.2)
#   python3-confluent-kafka  kafkapython_test.go (confluent-kafka python)
#   python3-snappy, python3-lz4, python3-zstandard
#                            the codecs kafka-python compresses with
#   gcc, libc6-dev           cgo for confluent-kafka-go (bundled librdkafka)
#
# Idempotent and quiet: does nothing and prints nothing when everything is
# installed; prints one line when it installs something, and apt's output
# only when an install fails. Called by the Makefile's tools target.
# Without apt-get/dpkg (not Debian) it warns and exits 0: the tests that
# need a missing tool skip with a message saying so.
set -euo pipefail

packages=(kcat python3-kafka python3-confluent-kafka python3-snappy python3-lz4 python3-zstandard gcc libc6-dev)

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
	echo "compat-tests/install-deps.sh: no dpkg/apt-get here; install ${packages[*]} by hand (tests that need them skip)" >&2
	exit 0
fi

missing=()
for p in "${packages[@]}"; do
	if [ "$p" = gcc ] && command -v gcc >/dev/null 2>&1; then
		continue
	fi
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if ! command -v sudo >/dev/null 2>&1; then
		echo "compat-tests/install-deps.sh: need root (or sudo) to install: ${missing[*]}" >&2
		exit 1
	fi
	sudo=(sudo)
fi

echo "installing Debian packages for compat-tests: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! out=$("${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" 2>&1); then
	# The package lists may be missing or stale: update once and retry.
	if ! out=$( { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"; } 2>&1); then
		echo "$out" >&2
		echo "compat-tests/install-deps.sh: apt-get install ${missing[*]} failed" >&2
		exit 1
	fi
fi
