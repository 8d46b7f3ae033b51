#!/usr/bin/env bash
# Builds redbaton and runs the demo against a private redis-server it starts itself.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-redis.sh
cargo run --release --example quickstart
