-- Acquire or re-enter a lock (Redisson's RLock layout: a hash of owner field -> count).
-- KEYS[1]  the lock hash
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner field "<client uuid>:<owner number>"
-- Reply: {1, count} when acquired (count 1: a fresh hold; more: a re-entry),
--        {0, pttl}  when another owner holds it.
-- A re-entry never shortens the expiry: an outer hold of the same owner may rely on a longer
-- lease than this call asks for.
if redis.call('exists', KEYS[1]) == 0 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, 1}
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return {1, count}
end
return {0, redis.call('pttl', KEYS[1])}
