-- Give permits back to a semaphore and tell waiters how many are free now.
-- KEYS[1]  the counter (created when absent, as Redisson does)
-- ARGV[1]  how many permits (>= 1)
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- ARGV[3]  the channel "redisson_sc:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: the new number of free permits; nil, with nothing changed, when it would pass the
--        largest Java int, which a Redisson peer reads it as.
-- The message is the new count, as Redisson publishes it, but only when it is positive:
-- 0 wakes nobody and a negative count breaks Redisson's listeners.
local value = redis.call('get', KEYS[1])
if value and (not string.match(value, '^%-?%d+$') or #value > 15) then
    return redis.error_reply('WRONGTYPE the semaphore key holds a string that is not a permit count')
end
if tonumber(value or '0') + tonumber(ARGV[1]) > 2147483647 then
    return false
end
local free = redis.call('incrby', KEYS[1], ARGV[1])
if free > 0 then
    redis.call(ARGV[2], ARGV[3], free)
end
return free
