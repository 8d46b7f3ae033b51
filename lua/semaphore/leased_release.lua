-- Release one permit of a leased semaphore by its id; free it and tell waiters.
-- KEYS[1]  N: the counter of free permits
-- KEYS[2]  T: "{name}:timeout", the zset of taken permits
-- ARGV[1]  the permit's field "<client uuid>:<32 hex digits>", or the 32 hex digits alone
-- ARGV[2]  how many holds to release at most (1, or 0 to release nothing)
-- ARGV[3]  how many holds to keep at least (a permit is one hold: 1 keeps it)
-- ARGV[4]  publish command: PUBLISH or SPUBLISH
-- ARGV[5]  C: the channel "redisson_sc:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: -1 when there is no such permit, or its lease had ended (then it is freed anyway,
--        as Redisson does); 0 when released; 1 when kept.
-- The message is the new count of free permits, when positive (Redisson publishes it even
-- when it is not, which wakes nobody).
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local hex = string.sub(ARGV[1], -32)
local id = (string.gsub(hex, '..', function(cc) return string.char(tonumber(cc, 16)) end))

local value = redis.call('get', KEYS[1])
if value and (not string.match(value, '^%-?%d+$') or #value > 15) then
    return redis.error_reply('WRONGTYPE the semaphore key holds a string that is not a permit count')
end
local score = redis.call('zscore', KEYS[2], id)
if not score then
    return -1
end
local live = tonumber(score) > now
if live and (tonumber(ARGV[2]) < 1 or tonumber(ARGV[3]) >= 1) then
    return 1
end
redis.call('zrem', KEYS[2], id)
local free = redis.call('incrby', KEYS[1], 1)
if free > 0 then
    redis.call(ARGV[4], ARGV[5], free)
end
if live then
    return 0
end
return -1
