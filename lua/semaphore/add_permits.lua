-- Add to (or, with a negative delta, take from) a semaphore's free permits (addPermits).
-- KEYS[1]  the counter (created when absent)
-- KEYS[2]  optional: with "delta" (a leased semaphore), the zset of taken permits, which all
--          come back to the counter one day; with "count" (a plain semaphore), its record of
--          its total (see set_total.lua), moved by the delta too when it exists
-- ARGV[1]  the delta
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- ARGV[3]  what the message carries: "count" (the new count: RSemaphore) or "delta" (the
--          delta: RPermitExpirableSemaphore)
-- ARGV[4]  the channel "redisson_sc:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: the new number of free permits; nil, with nothing changed, when the count (with the
--        taken permits) would move out of a Java int, which a Redisson peer reads it as (a
--        count already out, set by hand, may be moved back).
-- SET, like Redisson's: it clears any expiry on the counter. Nothing is published when the
-- message would not be positive.
local value = redis.call('get', KEYS[1])
if value and (not string.match(value, '^%-?%d+$') or #value > 15) then
    return redis.error_reply('WRONGTYPE the semaphore key holds a string that is not a permit count')
end
local delta = tonumber(ARGV[1])
local free = tonumber(value or '0') + delta
local taken = 0
if KEYS[2] and ARGV[3] == 'delta' then
    taken = redis.call('zcard', KEYS[2])
end
if (delta > 0 and free + taken > 2147483647) or (delta < 0 and free < -2147483648) then
    return false
end
redis.call('set', KEYS[1], string.format('%d', free))
if KEYS[2] and ARGV[3] == 'count' and redis.call('exists', KEYS[2]) == 1 then
    redis.call('incrby', KEYS[2], delta)
end
local message = free
if ARGV[3] == 'delta' then
    message = delta
end
if message > 0 then
    redis.call(ARGV[2], ARGV[4], string.format('%d', message))
end
return free
