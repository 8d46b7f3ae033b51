#!/usr/bin/env bash
# Runs the whole test suite against real redis-server processes the tests start themselves
# (tests/interop.rs also runs node-redisson, installed by scripts/install-node.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-redis.sh
bash scripts/install-node.sh
cargo test --no-fail-fast --lib --bins --tests --examples "$@"
cargo test --doc
# The `metrics` feature's own tests (exact counters, gauges and histograms).
cargo test --features metrics --test metrics
