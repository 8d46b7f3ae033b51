-- Acquire or re-enter a fenced lock (Redisson's RFencedLock: the RLock hash plus a token
-- counter that every successful acquire, re-entry included, increments first).
-- KEYS[1]  the lock hash
-- KEYS[2]  the token counter "redisson_lock_token:{name}" (no expiry: tokens never repeat)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner field "<client uuid>:<owner number>"
-- Reply: {1, count, token} when acquired, {0, pttl} when another owner holds it.
-- A refused attempt never increments the token. A re-entry never shortens the expiry.
-- Calls GET and INCR on KEYS[2] besides the RLock script's commands.
local fresh = redis.call('exists', KEYS[1]) == 0
if not fresh and redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return {0, redis.call('pttl', KEYS[1])}
end
-- A counter that INCR cannot advance to a real token (not an integer, or below zero: set by
-- hand) is refused before anything is written, so no hold is taken that nobody accounts for.
local last = redis.call('get', KEYS[2])
if last and not string.match(last, '^%d+$') then
    return redis.error_reply('WRONGTYPE the token counter ' .. KEYS[2] .. ' holds "' .. last
        .. '", not a count of tokens')
end
local token = redis.call('incr', KEYS[2])
local count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
if fresh or redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('pexpire', KEYS[1], ARGV[1])
end
return {1, count, token}
