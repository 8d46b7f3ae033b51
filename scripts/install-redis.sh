#!/usr/bin/env bash
# Installs redis-server, redis-cli and openssl (TLS tests) from Debian's packages when they are missing.
set -euo pipefail
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null && command -v openssl >/dev/null; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q redis-server redis-tools openssl
