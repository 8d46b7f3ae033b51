#!/usr/bin/env bash
# Runs the whole test suite against real redis-server processes the tests start themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-redis.sh
cargo test --lib --bins --tests --examples "$@"
cargo test --doc
