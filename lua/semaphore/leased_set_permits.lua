-- Set a leased semaphore's total number of permits to ARGV[1], taken ones included: every
-- permit whose lease ended is reclaimed first (so the permits of dead holders do not count),
-- then the free count becomes the total less the permits still taken (Redisson's
-- setPermits, less its counting of ended leases).
-- KEYS[1]  N: the counter of free permits
-- KEYS[2]  T: "{name}:timeout", the zset of taken permits
-- ARGV[1]  the new total (>= 0)
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- ARGV[3]  C: the channel "redisson_sc:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: {the new free count, the permits taken}. The new free count is published when
-- positive. "Now" is the server's clock (TIME).
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local value = redis.call('get', KEYS[1])
if value and (not string.match(value, '^%-?%d+$') or #value > 15) then
    return redis.error_reply('WRONGTYPE the semaphore key holds a string that is not a permit count')
end
local expired = redis.call('zrangebyscore', KEYS[2], 0, now)
for i = 1, #expired, 1000 do
    redis.call('zrem', KEYS[2], unpack(expired, i, math.min(i + 999, #expired)))
end
local taken = redis.call('zcard', KEYS[2])
local free = tonumber(ARGV[1]) - taken
redis.call('set', KEYS[1], string.format('%d', free))
if free > 0 then
    redis.call(ARGV[2], ARGV[3], string.format('%d', free))
end
return {free, taken}
