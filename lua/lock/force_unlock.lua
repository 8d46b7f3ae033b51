-- Delete a lock whoever holds it, and wake its waiters.
-- Refuses a key that is not a lock hash, so user data is never deleted.
-- KEYS[1]  the lock hash
-- ARGV[1]  unlock message ("0")
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- ARGV[3]  the lock's channel (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: 1 when a lock was deleted, 0 when there was none.
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
    return 0
end
if kind ~= 'hash' or redis.call('pttl', KEYS[1]) < 0 then
    return redis.error_reply('WRONGTYPE key is a ' .. kind .. ' without the expiry every lock has; not a lock')
end
redis.call('del', KEYS[1])
redis.call(ARGV[2], ARGV[3], ARGV[1])
return 1
