#!/usr/bin/env bash
# Installs node and npm from Debian's packages when they are missing, then the interop suite's
# pinned Node packages (interop/node/package-lock.json: node-redisson, ioredis) with `npm ci`.
# tests/interop.rs needs both; it fails and names this script when they are not there.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q nodejs npm
fi
cd interop/node
# `npm ci` reinstalls from scratch; skip it when the installed tree is from this very lock file.
stamp=node_modules/.redbaton-lock
if [ -f "$stamp" ] && cmp -s package-lock.json "$stamp"; then
    exit 0
fi
npm ci --no-audit --no-fund
cp package-lock.json "$stamp"
