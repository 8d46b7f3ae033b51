-- Delete a lock whoever holds it, and wake its waiters.
-- Refuses a key that is not a lock hash, so user data is never deleted.
-- KEYS[1]  the lock hash
-- KEYS[2]  the lock's channel
-- ARGV[1]  unlock message ("0")
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- Reply: 1 when a lock was deleted, 0 when there was none.
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
    return 0
end
if kind ~= 'hash' or redis.call('pttl', KEYS[1]) < 0 then
    return redis.error_reply('WRONGTYPE key is a ' .. kind .. ' without the expiry every lock has; not a lock')
end
redis.call('del', KEYS[1])
redis.call(ARGV[2], KEYS[2], ARGV[1])
return 1
