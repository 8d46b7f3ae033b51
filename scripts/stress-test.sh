#!/usr/bin/env bash
# Runs the whole test suite N times (default 5) while two busy loops keep both cores loaded,
# and reports which tests failed in which run. Not part of CI (it takes N times the suite).
#
#   scripts/stress-test.sh            # 5 runs
#   scripts/stress-test.sh 10         # 10 runs
#   scripts/stress-test.sh 3 -- multilock  # 3 runs of the tests whose names match (the rest
#                                          # goes to cargo test)
#
# Environment: STRESS_BUSY (busy loops, default 2), STRESS_RUN_TIMEOUT (seconds per run,
# default 1800). Logs go to target/stress/run-<n>.log. Exits non-zero if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=5
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
    runs=$1
    shift
fi
if [[ $runs -lt 1 ]]; then
    echo "usage: $0 [runs >= 1] [extra cargo test arguments]" >&2
    exit 2
fi
busy=${STRESS_BUSY:-2}
run_timeout=${STRESS_RUN_TIMEOUT:-1800}
targets=(--workspace --lib --bins --tests --examples)
logs=target/stress
mkdir -p "$logs"

bash scripts/install-redis.sh
bash scripts/install-node.sh   # node-redisson for tests/interop.rs, as scripts/test.sh does
bash scripts/install-java-peer.sh   # the Java Redisson driver for tests/redisson/, as scripts/test.sh does

# Build once; the build is not a run.
echo "building the tests..."
cargo test "${targets[@]}" --no-run "$@" >"$logs/build.log" 2>&1 || {
    cat "$logs/build.log" >&2
    echo "build failed" >&2
    exit 1
}

busy_pids=()
stop_busy() {
    for pid in "${busy_pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${busy_pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    busy_pids=()
}
trap stop_busy EXIT
trap 'stop_busy; exit 130' INT TERM
for _ in $(seq 1 "$busy"); do
    (while :; do :; done) &
    busy_pids+=($!)
done
echo "$busy busy loops running (pids ${busy_pids[*]})"

# "<test file>::<test name>" for every failed test in a libtest log; the file comes from
# cargo's "Running tests/lock/main.rs (target/...)" line before each test binary's output.
failures_in() {
    awk '
        /^ *Running / { bin = $2; if (bin == "unittests") bin = $3; next }
        /^ *Doc-tests / { bin = "doc:" $2; next }
        /^test .* \.\.\. FAILED/ { print bin "::" $2 }
    ' "$1" | sort -u
}

passed=0
summary=()
for run in $(seq 1 "$runs"); do
    log="$logs/run-$run.log"
    first_row=${#summary[@]}
    started=$(date +%s)
    echo "run $run/$runs..."
    set +e
    timeout --kill-after=30 "$run_timeout" \
        cargo test "${targets[@]}" --no-fail-fast "$@" >"$log" 2>&1
    status=$?
    set -e
    took=$(($(date +%s) - started))
    failed=$(failures_in "$log")
    if [[ $status -eq 0 ]]; then
        passed=$((passed + 1))
        summary+=("$(printf '%4d  %5ss  passed' "$run" "$took")")
    else
        if [[ $status -eq 124 || $status -eq 137 ]]; then
            failed+="${failed:+$'\n'}(timed out after ${run_timeout}s)"
        elif [[ -z $failed ]]; then
            failed="(exit status $status, no failed test line: see $log)"
        fi
        first=1
        while IFS= read -r line; do
            if [[ $first -eq 1 ]]; then
                summary+=("$(printf '%4d  %5ss  FAILED  %s' "$run" "$took" "$line")")
                first=0
            else
                summary+=("$(printf '%4s  %5s   FAILED  %s' "" "" "$line")")
            fi
        done <<<"$failed"
    fi
    printf '%s\n' "${summary[@]:first_row}"
done

stop_busy
echo
echo " run   time  result"
printf '%s\n' "${summary[@]}"
echo
echo "$passed/$runs runs passed (logs in $logs/)"
[[ $passed -eq $runs ]]
