-- Reclaim every permit whose lease ended, then count (availablePermits, acquiredPermits).
-- KEYS[1]  N: the counter of free permits
-- KEYS[2]  T: "{name}:timeout", the zset of taken permits
-- ARGV[1]  publish command: PUBLISH or SPUBLISH
-- ARGV[2]  C: the channel "redisson_sc:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: {free permits (0 when not initialised), permits taken}.
-- Reclaimed permits are announced with the new free count, when positive.
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
return {free, taken - #expired}
