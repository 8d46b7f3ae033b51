-- Drop every hold one owner has on a lock (used at client shutdown), and wake waiters.
-- KEYS[1]  the lock hash
-- KEYS[2]  the lock's channel
-- ARGV[1]  unlock message ("0")
-- ARGV[2]  owner field
-- ARGV[3]  publish command: PUBLISH or SPUBLISH
-- Reply: 1 when the owner held the lock, 0 when it did not.
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return 0
end
redis.call('hdel', KEYS[1], ARGV[2])
if redis.call('hlen', KEYS[1]) == 0 then
    redis.call('del', KEYS[1])
    redis.call(ARGV[3], KEYS[2], ARGV[1])
end
return 1
