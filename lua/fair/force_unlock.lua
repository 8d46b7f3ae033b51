-- Delete a fair lock whoever holds it, and wake the owner at the head of the queue.
-- Refuses a key that is not a lock hash, so user data is never deleted. The queue stays.
-- KEYS[1]  the lock hash
-- KEYS[2]  the queue "redisson_lock_queue:{name}"
-- KEYS[3]  the timeouts "redisson_lock_timeout:{name}"
-- ARGV[1]  unlock message ("0")
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- ARGV[3]  the channel prefix "redisson_lock__channel:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: 1 when a lock was deleted, 0 when there was none.
-- "Now" is the server's clock (TIME): every redbaton client reads the same one.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- A node migrating the slot away fails a script half-way when it reads a key it no longer
-- has: once the last entry is dropped, the queue (and the timeouts with it) is not read again.
local queued = true
while queued do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then
        break
    end
    local timeout = redis.call('zscore', KEYS[3], head)
    if not timeout or tonumber(timeout) > now then
        break
    end
    queued = redis.call('lindex', KEYS[2], 1) ~= false
    redis.call('zrem', KEYS[3], head)
    redis.call('lpop', KEYS[2])
end
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
    return 0
end
if kind ~= 'hash' or redis.call('pttl', KEYS[1]) < 0 then
    return redis.error_reply('WRONGTYPE key is a ' .. kind .. ' without the expiry every lock has; not a lock')
end
redis.call('del', KEYS[1])
local head = queued and redis.call('lindex', KEYS[2], 0)
if head then
    redis.call(ARGV[2], ARGV[3] .. ':' .. head, ARGV[1])
end
return 1
