-- Release holds of one owner of a fair lock; at zero delete the lock and wake the owner at
-- the head of the queue, on its own channel.
-- KEYS[1]  the lock hash
-- KEYS[2]  the queue "redisson_lock_queue:{name}"
-- KEYS[3]  the timeouts "redisson_lock_timeout:{name}"
-- ARGV[1]  owner field
-- ARGV[2]  how many holds to release at most (1 for an unlock)
-- ARGV[3]  how many holds to keep at least
-- ARGV[4]  unlock message ("0")
-- ARGV[5]  publish command: PUBLISH or SPUBLISH
-- ARGV[6]  the channel prefix "redisson_lock__channel:{name}" (the head's is "<prefix>:<field>")
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: -1 when the owner holds nothing, 0 when the lock was released, else the owner's
--        remaining count. The expiry is left alone while holds remain.
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

local function wake_head()
    local head = queued and redis.call('lindex', KEYS[2], 0)
    if head then
        redis.call(ARGV[5], ARGV[6] .. ':' .. head, ARGV[4])
    end
end

local count = redis.call('hget', KEYS[1], ARGV[1])
if not count then
    -- Gone (expired, force-unlocked): the head may not know the lock is free.
    if redis.call('exists', KEYS[1]) == 0 then
        wake_head()
    end
    return -1
end
count = tonumber(count)
local release = math.min(tonumber(ARGV[2]), count - tonumber(ARGV[3]))
if release <= 0 then
    return count
end
if count > release then
    return redis.call('hincrby', KEYS[1], ARGV[1], -release)
end
redis.call('del', KEYS[1])
wake_head()
return 0
