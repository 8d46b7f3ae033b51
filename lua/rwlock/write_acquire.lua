-- Acquire or re-enter the write hold (Redisson's RReadWriteLock write half).
-- KEYS[1]  the lock hash (see read_acquire.lua)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  writer field "<uuid>:<n>:write"
-- ARGV[3]  the same owner's reader field "<uuid>:<n>"
-- Reply: {1, count} when acquired (count 1: a fresh hold), {0, pttl} when refused,
--        {-1, pttl} when refused because this owner holds read holds itself: a read hold
--        cannot be upgraded, so waiting would never end.
-- Taken only when nobody holds the lock, or re-entered by the writer. The expiry is never
-- shortened (Redisson adds the lease to the remaining one; both keep the hold alive).
-- A key without "mode" is not a read/write lock: an existing one is reported as held, never
-- written to; one without an expiry is refused as not a lock (pttl -1).
local lease = tonumber(ARGV[1])
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    if redis.call('exists', KEYS[1]) == 1 then
        return {0, redis.call('pttl', KEYS[1])}
    end
    redis.call('hset', KEYS[1], 'mode', 'write', ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, 1}
end
local pttl = redis.call('pttl', KEYS[1])
if pttl < 0 then
    return {0, pttl}
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    if pttl < lease then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return {1, count}
end
if redis.call('hexists', KEYS[1], ARGV[3]) == 1 then
    return {-1, pttl}
end
return {0, pttl}
