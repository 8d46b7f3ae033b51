-- Delete a read/write lock in one mode whoever holds it, and wake its waiters (Redisson's
-- forceUnlock of one half: the read half clears only read mode, the write half only write).
-- Refuses a key that is not a lock hash, so user data is never deleted.
-- KEYS[1]  the lock hash
-- ARGV[1]  the mode this half clears: "read" or "write"
-- ARGV[2]  its message: "0" (read) or "1" (write)
-- ARGV[3]  publish command: PUBLISH or SPUBLISH
-- ARGV[4]  the lock's channel "redisson_rwlock:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: 1 when the lock was deleted, 0 when it was not held in that mode.
-- Readers' timeout keys are left to expire with their leases, as Redisson does.
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
    return 0
end
if kind ~= 'hash' or redis.call('pttl', KEYS[1]) < 0 then
    return redis.error_reply('WRONGTYPE key is a ' .. kind .. ' without the expiry every lock has; not a lock')
end
if redis.call('hget', KEYS[1], 'mode') ~= ARGV[1] then
    return 0
end
redis.call('del', KEYS[1])
redis.call(ARGV[3], ARGV[4], ARGV[2])
return 1
