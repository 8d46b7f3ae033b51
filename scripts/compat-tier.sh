#!/usr/bin/env bash
# The compatibility tier: a chosen part of the suite against another server than the default
# Redis 7.0 (which the whole suite runs against), chosen at run time by REDBATON_TEST_SERVER.
#
#   bash scripts/compat-tier.sh redis-6.2      # or valkey-8.1 (redis-7.0 works too)
#
# It reuses the test binaries the whole suite built (`cargo test` at the workspace root, as
# scripts/test.sh runs it: no rebuild), runs each test binary once with its filters, then a
# short soak, and ends with one line: `<server>: N passed, N failed, N skipped`. A test that
# needs what the server lacks prints `SKIPPED <test> on <server>: <why>` and is counted as
# skipped, not passed (testkit/src/servers.rs). What the tier covers and leaves out, and why:
# docs/VERSIONS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
server=${1:?usage: scripts/compat-tier.sh redis-6.2|valkey-8.1|redis-7.0}
bash scripts/install-servers.sh
export REDBATON_TEST_SERVER=$server
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export REDBATON_SKIP_LOG=$work/skipped
: > "$REDBATON_SKIP_LOG"

# One line per test binary: its name, then its filters (substrings of test names; none: all).
TIER=(
    # The server's version and what it refuses at connect; TLS (skipped where not built in).
    "servers"
    "tls"
    # Every lock kind (lock, fenced, read, write, fair): exclusion, re-entry, wake-up by the
    # message, a fixed lease (and the guard told), the watchdog, force-unlock felt by the holder.
    "family exclusion reentry wake_up_without_polling fixed_lease_ends watchdog_renews force_unlock_is_felt"
    # The semaphores: at most n, wake-ups, leases and their watchdog, the wire layout.
    "semaphore at_most_n_permits a_release_wakes_exactly wire_layout"
    "leased_semaphore leases:: a_release_wakes_a_parked_waiter at_most_n_permits wire_layout"
    # The lock's wire layout (Redisson's), scripts reloaded after SCRIPT FLUSH, force-unlock.
    "lock wire::wire_layout scripts_are_reloaded_after_script_flush lost_fires_after_force_unlock two_clients_exclude_each_other"
    # Group commit and the composite script.
    "group_commit grouped_acquisitions_share_script_calls concurrent_callers a_failing_member_of_a_composite a_nil_reply_in_a_composite a_flushed_composite noscript_in_a_group a_healthy_replica_acknowledges_every_group"
    # Lock cohorting (the hand-off in memory) and the baton pass (PUBSUB NUMSUB in a script).
    "cohort a_release_hands_the_hold_to_a_parked_task a_hot_key_of_sixteen_tasks a_waiter_of_another_client_is_served a_force_unlock_by_another_client_ends"
    "baton a_release_passes_the_lock_to_a_parked_task a_waiter_of_another_client_makes after_the_configured_passes a_passed_watchdog_hold_is_renewed with_passes_off"
    # The documented ACL of a lock user (resetchannels; HELLO needs no rule), without the
    # baton pass's rule: the refused pass falls back.
    "security a_refused_pass_falls_back"
    # Sentinel: the URL, replica sync keeping a hold through the master's death.
    "sentinel"
    # A cluster: wake-ups and baton passes on every primary, renewals across slots; sharded
    # pub/sub where the server has it.
    "cluster slots::classic_pubsub slots::sharded_pubsub slots::locks_in_different_slots"
    # Interop: node-redisson on the same locks, and the real Java Redisson's core lock set.
    "interop wake_ups_both_ways reentry_both_ways force_unlock_from_each_side mixed_counter"
    "redisson locks::lock::core_"
)

status=0
for entry in "${TIER[@]}"; do
    read -ra words <<< "$entry"
    echo "compat-tier.sh: $server: cargo test --test ${words[*]}"
    if ! cargo test --test "${words[0]}" -- "${words[@]:1}" 2>&1 | tee -a "$work/out"; then
        status=1
    fi
done
# A short soak: mutual exclusion across processes under faults (kills, restarts, stalls).
echo "compat-tier.sh: $server: a short soak"
if ! cargo run -p redbaton-soak -- --acquisitions 2000 --names 4 --tasks 8; then
    echo "compat-tier.sh: $server: the soak failed" >&2
    status=1
fi

sum() { grep -o "[0-9]* $1" "$work/out" | awk '{n += $1} END {print n + 0}'; }
passed=$(sum passed)
failed=$(sum failed)
# A whole test skipped is not a pass; a skipped part ("its sharded half") leaves a test that ran.
whole=$(grep -c '^SKIPPED [^ ]* on ' "$REDBATON_SKIP_LOG" || true)
echo
echo "compat-tier.sh: skipped on $server:"
sed 's/^/  /' "$REDBATON_SKIP_LOG"
echo "compat-tier.sh: $server took ${SECONDS}s"
echo "$server: $((passed - whole)) passed, $failed failed, $whole skipped"
exit $status
