-- Initialise a semaphore's free permits, only if it has none set yet (trySetPermits).
-- KEYS[1]  the counter
-- KEYS[2]  optional: a plain semaphore's record of its total, "{name}:permits", written with
--          the count (see set_total.lua)
-- ARGV[1]  the number of permits (>= 0)
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- ARGV[3]  the channel "redisson_sc:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: 1 when set (and, if positive, published), 0 when the counter already exists.
-- A key of another type is refused (WRONGTYPE), never reported as "already set".
local kind = redis.call('type', KEYS[1]).ok
if kind == 'none' then
    redis.call('set', KEYS[1], ARGV[1])
    if KEYS[2] then
        redis.call('set', KEYS[2], ARGV[1])
    end
    if tonumber(ARGV[1]) > 0 then
        redis.call(ARGV[2], ARGV[3], ARGV[1])
    end
    return 1
end
if kind ~= 'string' then
    return redis.error_reply('WRONGTYPE the semaphore key holds a ' .. kind)
end
local value = redis.call('get', KEYS[1])
if not string.match(value, '^%-?%d+$') or #value > 15 then
    return redis.error_reply('WRONGTYPE the semaphore key holds a string that is not a permit count')
end
return 0
