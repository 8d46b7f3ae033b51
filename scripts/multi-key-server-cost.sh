#!/usr/bin/env bash
# Server CPU per acquisition (redis-server's own used_cpu_user + used_cpu_sys, from INFO cpu):
# the lock's acquire script (lua/lock/acquire.lua) one key per call, pipelined 16 deep, against
# one call applying the same logic to 16 keys, and `SET NX PX` for reference. Fresh keys mostly
# (random among 10 million, 100 ms lease). Measures what a multi-key script per group could
# save on the server (issue 25); needs redis-server and redis-benchmark; a throwaway server on
# PORT (default 7391).
#
#   scripts/multi-key-server-cost.sh            # 3 rounds of 200,000 acquisitions
#   N=100000 ROUNDS=5 scripts/multi-key-server-cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
port=${PORT:-7391}
n=${N:-200000}
rounds=${ROUNDS:-3}
redis-server --port "$port" --save "" --appendonly no --daemonize yes --logfile /dev/null
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
cli() { redis-cli -p "$port" "$@"; }
# The acquire script's logic applied to every key: KEYS[i] with ARGV[1] lease, ARGV[i+1] field.
multi_lua='local out = {}
for i = 1, #KEYS do
    local k, f = KEYS[i], ARGV[i + 1]
    if redis.call("exists", k) == 0 then
        redis.call("hincrby", k, f, 1)
        redis.call("pexpire", k, ARGV[1])
        out[i] = 1
    elseif redis.call("hexists", k, f) == 1 then
        redis.call("hincrby", k, f, 1)
        out[i] = 2
    else
        out[i] = -redis.call("pttl", k)
    end
end
return out'
single=$(cli script load "$(cat lua/lock/acquire.lua)")
multi=$(cli script load "$multi_lua")
cpu() { cli info cpu | awk -F: '/used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'; }
keys=() fields=()
for _ in $(seq 16); do keys+=("lk:__rand_int__"); fields+=("owner:1"); done
for round in $(seq "$rounds"); do
    a=$(cpu)
    redis-benchmark -p "$port" -q -n "$n" -P 16 -r 10000000 \
        evalsha "$single" 1 lk:__rand_int__ 100 owner:1 >/dev/null
    b=$(cpu)
    redis-benchmark -p "$port" -q -n $((n / 16)) -P 1 -r 10000000 \
        evalsha "$multi" 16 "${keys[@]}" 100 "${fields[@]}" >/dev/null
    c=$(cpu)
    redis-benchmark -p "$port" -q -n "$n" -P 16 -r 10000000 \
        set sk:__rand_int__ owner:1 nx px 100 >/dev/null
    d=$(cpu)
    python3 -c "
n, calls = $n, $n // 16
single = ($b - $a) / n * 1e6
multi = ($c - $b) / (calls * 16) * 1e6
set_nx = ($d - $c) / n * 1e6
print(f'round $round: acquire script {single:.2f} us/acq, 16 keys per call {multi:.2f} us/acq '
      f'(ratio {multi / single:.2f}); SET NX PX {set_nx:.2f} us/acq')"
done
