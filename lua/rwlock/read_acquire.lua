-- Acquire or re-enter a read hold (Redisson's RReadWriteLock read half).
-- KEYS[1]  the lock hash: "mode" = "read" | "write", reader fields "<uuid>:<n>" -> count,
--          the writer field "<uuid>:<n>:write" -> count
-- KEYS[2]  this owner's timeout-key prefix "{name}:<uuid>:<n>:rwlock_timeout" (Redisson's
--          suffixName rule: "<name>:<uuid>:<n>:rwlock_timeout" when the name has a "{")
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner field "<uuid>:<n>"
-- ARGV[3]  the same owner's writer field "<uuid>:<n>:write"
-- Reply: {1, count} when acquired (count 1: a fresh hold), {0, pttl} when refused.
-- Taken when nobody holds the lock, when it is in read mode, or when this owner holds the write
-- lock (a writer may also read). Every hold i gets its timeout key "<prefix>:i" with the lease,
-- as Redisson's read-unlock expects. The hash's expiry is never shortened. The hash's expiry is
-- set before the timeout key's: the clock can move between two commands of a script on a
-- loaded server, and a timeout key ending a millisecond before the hash would make a later
-- read-unlock see the expiry "come down" and publish for nothing.
-- A key without "mode" is not a read/write lock: an existing one (an RLock hash) is reported as
-- held, never written to; one without an expiry is refused as not a lock (pttl -1).
local lease = tonumber(ARGV[1])
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    if redis.call('exists', KEYS[1]) == 1 then
        return {0, redis.call('pttl', KEYS[1])}
    end
    redis.call('hset', KEYS[1], 'mode', 'read', ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    redis.call('set', KEYS[2] .. ':1', 1, 'px', ARGV[1])
    return {1, 1}
end
local pttl = redis.call('pttl', KEYS[1])
if pttl < 0 then
    return {0, pttl}
end
if mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
    local count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    if pttl < lease then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    redis.call('set', KEYS[2] .. ':' .. count, 1, 'px', ARGV[1])
    return {1, count}
end
return {0, pttl}
