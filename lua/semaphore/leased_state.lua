-- Reclaim every permit whose lease ended, then count (availablePermits, acquiredPermits) —
-- and, given a permit id, set the lease of that permit if it is still held (updateLeaseTime).
-- KEYS[1]  N: the counter of free permits
-- KEYS[2]  T: "{name}:timeout", the zset of taken permits
-- ARGV[1]  publish command: PUBLISH or SPUBLISH
-- ARGV[2]  C: the channel "redisson_sc:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- ARGV[3]  optional: the permit id, 32 hex digits
-- ARGV[4]  with ARGV[3]: its new lease in ms, from now (longer or shorter than it was)
-- Reply: {free permits (0 when not initialised), permits taken, 1 when the lease of the
--        permit ARGV[3] was set, else 0}.
-- Reclaimed permits are announced with the new free count, when positive. A permit whose
-- lease ended is reclaimed before it is looked for, as Redisson does: it is never revived.
-- "Now" is the server's clock (TIME).
local SENTINEL = 922337203685477
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local value = redis.call('get', KEYS[1])
if value and (not string.match(value, '^%-?%d+$') or #value > 15) then
    return redis.error_reply('WRONGTYPE the semaphore key holds a string that is not a permit count')
end
local taken = redis.call('zcard', KEYS[2])
local expired = redis.call('zrangebyscore', KEYS[2], 0, now)
local free = tonumber(value or '0')
if #expired > 0 then
    for i = 1, #expired, 1000 do
        redis.call('zrem', KEYS[2], unpack(expired, i, math.min(i + 999, #expired)))
    end
    free = redis.call('incrby', KEYS[1], #expired)
    if free > 0 then
        redis.call(ARGV[1], ARGV[2], free)
    end
end
local updated = 0
if ARGV[3] then
    local id = (string.gsub(ARGV[3], '..', function(cc) return string.char(tonumber(cc, 16)) end))
    if redis.call('zscore', KEYS[2], id) then
        redis.call('zadd', KEYS[2], math.min(now + tonumber(ARGV[4]), SENTINEL - 1), id)
        updated = 1
    end
end
return {free, taken - #expired, updated}
