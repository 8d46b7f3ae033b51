-- Take one permit with a lease, or several at once, all or none (Redisson's
-- RPermitExpirableSemaphore layout).
-- KEYS[1]  N: the counter of free permits (a string; absent = not initialised)
-- KEYS[2]  T: "{name}:timeout", a zset of taken permits: member = the permit id as 16 raw
--          bytes, score = the end of its lease in epoch ms (922337203685477: no lease)
-- ARGV[1]  the hold's field: "<client uuid>:<ids>", the 32 hex digits of each permit's id one
--          after the other (one id, or the ids of the permits taken together)
-- ARGV[2]  the lease in ms
-- ARGV[3]  publish command: PUBLISH or SPUBLISH
-- ARGV[4]  C: the channel "redisson_sc:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: {1, 1, hex of the first id} when taken; {0, ms} when none is free and the first
--        lease ends in ms milliseconds, {0, -1} when none is free and no lease is due; {-1, ms}
--        or {-1, -1} likewise when some are free, but fewer than asked for (a smaller request
--        could take them).
-- "Now" is the server's clock (TIME): every redbaton client reads the same one.
-- Leases past their end are reclaimed first (Redisson reclaims lazily too: nothing ends a
-- lease but the next script that looks), and waiters are told if permits stay free.
-- An id already taken with a live lease is this same acquire once more (its first reply was
-- lost; the ids are random and taken all together): it is answered again, never taken twice.
local SENTINEL = 922337203685477
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local hexes = string.match(ARGV[1], '([^:]*)$')
local ids = {}
for at = 1, #hexes, 32 do
    local hex = string.sub(hexes, at, at + 31)
    ids[#ids + 1] = (string.gsub(hex, '..', function(cc) return string.char(tonumber(cc, 16)) end))
end
local n = #ids
local first = string.sub(hexes, 1, 32)

-- Checks first: a script's writes are not undone when it fails half-way.
local value = redis.call('get', KEYS[1])
if value and (not string.match(value, '^%-?%d+$') or #value > 15) then
    return redis.error_reply('WRONGTYPE the semaphore key holds a string that is not a permit count')
end
local taken = redis.call('zscore', KEYS[2], ids[1])
if taken and tonumber(taken) > now then
    return {1, 1, first}
end

local expired = redis.call('zrangebyscore', KEYS[2], 0, now, 'limit', 0, 100)
local free = tonumber(value or '0') + #expired
-- A node migrating the slot away fails a script half-way when it touches a key it no longer
-- has: the set of taken permits is emptied (by reclaiming its last ones) only when nothing
-- reads or writes it afterwards. `keep` holds the permits already written again.
local function reclaim(keep)
    if #expired == 0 then
        return
    end
    local gone = {}
    for _, member in ipairs(expired) do
        if not keep[member] then
            gone[#gone + 1] = member
        end
    end
    if #gone > 0 then
        redis.call('zrem', KEYS[2], unpack(gone))
    end
    redis.call('incrby', KEYS[1], #expired)
end
if (value or #expired > 0) and free >= n then
    local expiry = math.min(now + tonumber(ARGV[2]), SENTINEL - 1)
    local written = {}
    for _, id in ipairs(ids) do
        redis.call('zadd', KEYS[2], expiry, id)
        written[id] = true
    end
    reclaim(written)
    redis.call('decrby', KEYS[1], n)
    local pttl = redis.call('pttl', KEYS[1])
    if pttl > 0 then
        redis.call('pexpire', KEYS[2], pttl)
    end
    if #expired > 0 and free > n then
        redis.call(ARGV[3], ARGV[4], free - n)
    end
    return {1, 1, first}
end
-- The first permit left once the expired ones (the lowest scores) are gone.
local head = redis.call('zrange', KEYS[2], #expired, #expired, 'withscores')
reclaim({})
local refused = 0
if free >= 1 and (value or #expired > 0) then
    refused = -1
end
if head[2] and tonumber(head[2]) < SENTINEL then
    return {refused, math.max(1, tonumber(head[2]) - now)}
end
return {refused, -1}
