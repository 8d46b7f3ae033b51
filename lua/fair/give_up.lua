-- A fair-lock waiter gives up (timeout, cancellation, error): it leaves the queue, and those
-- behind it move up by the wait it had queued with. If that makes another owner the head
-- while the lock is free, that owner is woken on its channel: nobody else would tell it.
-- KEYS[1]  the lock hash
-- KEYS[2]  the queue "redisson_lock_queue:{name}"
-- KEYS[3]  the timeouts "redisson_lock_timeout:{name}"
-- ARGV[1]  owner field
-- ARGV[2]  the wait in ms it queued with
-- ARGV[3]  unlock message ("0")
-- ARGV[4]  publish command: PUBLISH or SPUBLISH
-- ARGV[5]  the channel prefix "redisson_lock__channel:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: 1 when the owner was queued, 0 when it was not.
-- "Now" is the server's clock (TIME): every redbaton client reads the same one.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local queue = redis.call('lrange', KEYS[2], 0, -1)
local at = nil
for i = 1, #queue do
    if queue[i] == ARGV[1] then
        at = i
        break
    end
end
redis.call('zrem', KEYS[3], ARGV[1])
if not at then
    return 0
end
local wait = tonumber(ARGV[2])
for i = at + 1, #queue do
    if queue[i] ~= ARGV[1] and redis.call('zscore', KEYS[3], queue[i]) then
        redis.call('zincrby', KEYS[3], -wait, queue[i])
    end
end
-- A node migrating the slot away fails a script half-way when it reads a key it no longer
-- has: once the last entry is dropped, the queue (and the timeouts with it) is not read again.
local queued = redis.call('lrem', KEYS[2], 0, ARGV[1]) < #queue
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
local head = queued and redis.call('lindex', KEYS[2], 0)
if head and head ~= queue[1] and redis.call('exists', KEYS[1]) == 0 then
    redis.call(ARGV[4], ARGV[5] .. ':' .. head, ARGV[3])
end
return 1
