-- Acquire or re-enter a fair lock (Redisson's RFairLock layout: the RLock hash, a queue list
-- of the waiting owner fields in arrival order, and a zset of their timeouts: epoch ms past
-- which a waiter at the head counts as dead).
-- KEYS[1]  the lock hash
-- KEYS[2]  the queue "redisson_lock_queue:{name}"
-- KEYS[3]  the timeouts "redisson_lock_timeout:{name}"
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner field "<client uuid>:<owner number>"
-- ARGV[3]  the owner's wait in ms: its timeout is its predecessor's plus this
-- ARGV[4]  "1": queue the owner if refused; "0": a single try that never queues
-- ARGV[5]  the longest park to suggest while the lock is free but another owner is next
-- Reply: {1, count} when acquired (count 1: a fresh hold; more: a re-entry),
--        {0, ms}    when refused: ms is the holder's PTTL, or, while the lock is free for a
--                   waiter ahead, how long until that one takes it or counts as dead (at
--                   most ARGV[5]); never 0 for a free lock, so a waiter never spins.
-- A re-entry never shortens the expiry.
-- "Now" is the server's clock (TIME): every redbaton client reads the same one.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local wait = tonumber(ARGV[3])

-- Drop heads whose timeout passed: they did not take their turn in time.
while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then
        break
    end
    local timeout = redis.call('zscore', KEYS[3], head)
    if not timeout or tonumber(timeout) > now then
        break
    end
    redis.call('zrem', KEYS[3], head)
    redis.call('lpop', KEYS[2])
end

local pttl = redis.call('pttl', KEYS[1])
if pttl == -2 then
    local head = redis.call('lindex', KEYS[2], 0)
    if not head or head == ARGV[2] then
        -- Free, and this owner is next (or nobody waits): it takes the lock and leaves the
        -- queue; everyone behind moves up by the wait it had queued with.
        redis.call('lpop', KEYS[2])
        redis.call('zrem', KEYS[3], ARGV[2])
        local waiting = redis.call('zrange', KEYS[3], 0, -1)
        for i = 1, #waiting do
            redis.call('zincrby', KEYS[3], -wait, waiting[i])
        end
        redis.call('hset', KEYS[1], ARGV[2], 1)
        redis.call('pexpire', KEYS[1], ARGV[1])
        return {1, 1}
    end
elseif redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    if pttl < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return {1, count}
end

-- Refused. How long to park before trying again, unless woken.
local function park()
    if pttl ~= -2 then
        return pttl
    end
    local left = tonumber(ARGV[5])
    local head = redis.call('lindex', KEYS[2], 0)
    local timeout = head and redis.call('zscore', KEYS[3], head)
    if timeout then
        left = math.min(left, tonumber(timeout) - now)
    end
    return math.max(left, 1)
end

if ARGV[4] ~= '1' or redis.call('zscore', KEYS[3], ARGV[2]) then
    return {0, park()}
end

-- Queue at the back: timed out one wait after the owner ahead of it, or after the holder's
-- lease when nobody is ahead.
local last = redis.call('lindex', KEYS[2], -1)
local ahead = false
if last and last ~= ARGV[2] then
    ahead = redis.call('zscore', KEYS[3], last)
end
local ttl = pttl
if ahead then
    ttl = tonumber(ahead) - now
end
if redis.call('zadd', KEYS[3], ttl + wait + now, ARGV[2]) == 1 then
    redis.call('rpush', KEYS[2], ARGV[2])
end
return {0, park()}
