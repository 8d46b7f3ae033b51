-- List a leased semaphore's taken permits, after reclaiming every permit whose lease ended
-- (for inspection: `redbaton status`).
-- KEYS[1]  N: the counter of free permits
-- KEYS[2]  T: "{name}:timeout", the zset of taken permits
-- ARGV[1]  publish command: PUBLISH or SPUBLISH
-- ARGV[2]  C: the channel "redisson_sc:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- ARGV[3]  the most permits to list (>= 1), soonest to end first
-- Reply: {now in epoch ms by the server's clock, id_1, score_1, id_2, score_2, ...}, scores
--        as strings (epoch ms; 922337203685477 for a permit without a lease).
-- Reclaimed permits are announced with the new free count, when positive.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expired = redis.call('zrangebyscore', KEYS[2], 0, now)
if #expired > 0 then
    for i = 1, #expired, 1000 do
        redis.call('zrem', KEYS[2], unpack(expired, i, math.min(i + 999, #expired)))
    end
    local free = redis.call('incrby', KEYS[1], #expired)
    if free > 0 then
        redis.call(ARGV[1], ARGV[2], free)
    end
end
local listed = redis.call('zrange', KEYS[2], 0, tonumber(ARGV[3]) - 1, 'WITHSCORES')
table.insert(listed, 1, now)
return listed
