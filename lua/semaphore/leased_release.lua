-- Release a hold of a leased semaphore — one permit, or the permits taken together — by its
-- ids; free them and tell waiters.
-- KEYS[1]  N: the counter of free permits
-- KEYS[2]  T: "{name}:timeout", the zset of taken permits
-- ARGV[1]  the hold's field "<client uuid>:<ids>" (the 32 hex digits of each id, one after
--          the other), or the ids alone
-- ARGV[2]  how many holds to release at most (1, or 0 to release nothing)
-- ARGV[3]  how many holds to keep at least (the field is one hold: 1 keeps it)
-- ARGV[4]  publish command: PUBLISH or SPUBLISH
-- ARGV[5]  C: the channel "redisson_sc:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: -1 when none of the permits is taken, or some of them are not, or their lease had
--        ended (the ones taken are freed anyway, as Redisson does); 0 when released; 1 when
--        kept. The hold is live only while every one of its permits is.
-- The message is the new count of free permits, when positive (Redisson publishes it even
-- when it is not, which wakes nobody).
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local hexes = string.match(ARGV[1], '([^:]*)$')

local value = redis.call('get', KEYS[1])
if value and (not string.match(value, '^%-?%d+$') or #value > 15) then
    return redis.error_reply('WRONGTYPE the semaphore key holds a string that is not a permit count')
end
local present = {}
local live = true
for at = 1, #hexes, 32 do
    local hex = string.sub(hexes, at, at + 31)
    local id = (string.gsub(hex, '..', function(cc) return string.char(tonumber(cc, 16)) end))
    local score = redis.call('zscore', KEYS[2], id)
    if score then
        present[#present + 1] = id
        live = live and tonumber(score) > now
    else
        live = false
    end
end
if #present == 0 then
    return -1
end
if live and (tonumber(ARGV[2]) < 1 or tonumber(ARGV[3]) >= 1) then
    return 1
end
redis.call('zrem', KEYS[2], unpack(present))
local free = redis.call('incrby', KEYS[1], #present)
if free > 0 then
    redis.call(ARGV[4], ARGV[5], free)
end
if live then
    return 0
end
return -1
