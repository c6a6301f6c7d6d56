#!/usr/bin/env bash
# Installs KafkaJS (npm) for kafkajs_test.go into $KAFKAJS_DIR (default
# ~/.cache/synapse-tools/node), outside the clone so a fresh clone reuses it.
# Needs node and npm; on Debian without them it installs the nodejs and npm
# packages. Idempotent and quiet when everything is there.
set -euo pipefail

version=2.2.4
dir="${KAFKAJS_DIR:-$HOME/.cache/synapse-tools/node}"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	if command -v apt-get >/dev/null 2>&1; then
		sudo=()
		[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo=(sudo)
		echo "compat-tests/install-kafkajs.sh: installing Debian's nodejs and npm"
		out=$("${sudo[@]}" apt-get update -qq 2>&1 && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm 2>&1) || {
			echo "$out" >&2
			exit 1
		}
	else
		echo "compat-tests/install-kafkajs.sh: no node/npm and no apt-get: the KafkaJS test skips" >&2
		exit 0
	fi
fi

if [ -f "$dir/node_modules/kafkajs/package.json" ] &&
	grep -q "\"version\": \"$version\"" "$dir/node_modules/kafkajs/package.json"; then
	exit 0
fi
mkdir -p "$dir"
echo "installing kafkajs $version into $dir"
out=$(cd "$dir" && npm install --no-audit --no-fund --silent "kafkajs@$version" 2>&1) || {
	echo "$out" >&2
	exit 1
}
