#!/usr/bin/env bash
# Runs the flash-sale demo on a fresh machine: installs redis-server if it is missing, builds
# redbaton in release mode, and runs `redbaton demo` (which starts and stops a private
# redis-server on a free loopback port). Extra arguments go to the demo, e.g. --stock 5000.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-redis.sh
cargo build --release -p redbaton-cli --bin redbaton
exec target/release/redbaton demo "$@"
