-- Set a plain semaphore's total number of permits to ARGV[1], held ones included: the free
-- count moves by the difference from the total last set (setPermits for RSemaphore, which
-- Redisson does not offer: a plain permit belongs to nobody, so the total is a record kept
-- beside the count by try_set_permits, add_permits and this script).
-- KEYS[1]  the counter of free permits
-- KEYS[2]  the record of the total, "{name}:permits"
-- ARGV[1]  the new total (>= 0)
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- ARGV[3]  the channel "redisson_sc:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: the new free count; the error NOTOTAL when the count exists without a record (set
--        by a Redisson peer, or by release/add_permits on an absent count); nil, nothing
--        changed, when the free count would leave a Java int.
-- An absent count is a new semaphore: count and record are set to the total (a record left
-- over from a deleted count is overwritten). The new count is published when positive.
local kind = redis.call('type', KEYS[1]).ok
local total = tonumber(ARGV[1])
if kind == 'none' then
    redis.call('set', KEYS[1], ARGV[1])
    redis.call('set', KEYS[2], ARGV[1])
    if total > 0 then
        redis.call(ARGV[2], ARGV[3], ARGV[1])
    end
    return total
end
if kind ~= 'string' then
    return redis.error_reply('WRONGTYPE the semaphore key holds a ' .. kind)
end
local value = redis.call('get', KEYS[1])
if not string.match(value, '^%-?%d+$') or #value > 15 then
    return redis.error_reply('WRONGTYPE the semaphore key holds a string that is not a permit count')
end
local recorded = redis.call('get', KEYS[2])
if not recorded or not string.match(recorded, '^%-?%d+$') then
    return redis.error_reply('NOTOTAL the semaphore has a count but no record of its total')
end
local free = tonumber(value) + total - tonumber(recorded)
if free < -2147483648 or free > 2147483647 then
    return false
end
redis.call('set', KEYS[1], string.format('%d', free))
redis.call('set', KEYS[2], ARGV[1])
if free > 0 then
    redis.call(ARGV[2], ARGV[3], string.format('%d', free))
end
return free
