#!/usr/bin/env bash
# Runs the whole test suite against real redis-server processes the tests start themselves
# (tests/interop.rs also runs node-redisson, installed by scripts/install-node.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-redis.sh
bash scripts/install-node.sh
cargo test --workspace --no-fail-fast --lib --bins --tests --examples "$@"
cargo test --workspace --doc
# The library without its default features: the unit tests include the check that a TLS URL
# is then refused rather than reached in plain text.
cargo test -p redbaton --no-default-features --lib
# The `metrics` feature's own tests (exact counters, gauges and histograms).
cargo test -p redbaton --features metrics --test metrics
cargo test -p redbaton --features metrics --doc
