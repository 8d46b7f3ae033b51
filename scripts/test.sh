#!/usr/bin/env bash
# Runs the whole test suite against real redis-server processes the tests start themselves
# (tests/interop.rs also runs node-redisson, installed by scripts/install-node.sh; tests/redisson/
# the real Java Redisson, built by scripts/install-java-peer.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-redis.sh
bash scripts/install-node.sh
bash scripts/install-java-peer.sh
cargo test --workspace --no-fail-fast --lib --bins --tests --examples "$@"
# The core interop set (exclusion, wake-ups, re-entry, every kind) against the last Redisson 3.x
# line too; the whole of tests/redisson ran above against 4.7.0.
REDBATON_REDISSON_VERSION=3.52.0 cargo test --test redisson core_ -- --skip cluster
cargo test --workspace --doc
# The library without its default features: the unit tests include the check that a TLS URL
# is then refused rather than reached in plain text.
cargo test -p redbaton --no-default-features --lib
# The `metrics` feature's own tests (exact counters, gauges and histograms).
cargo test -p redbaton --features metrics --test metrics
cargo test -p redbaton --features metrics --doc
