-- Release one hold of a lock; at zero delete it and wake one waiter per process.
-- KEYS[1]  the lock hash
-- KEYS[2]  the lock's channel (same hash slot as KEYS[1])
-- ARGV[1]  unlock message ("0")
-- ARGV[2]  lease in milliseconds to keep while holds remain
-- ARGV[3]  owner field
-- ARGV[4]  publish command: PUBLISH or SPUBLISH
-- Reply: nil when the caller holds nothing, 0 when holds remain, 1 when released.
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
end
local remaining = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if remaining > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 0
end
redis.call('del', KEYS[1])
redis.call(ARGV[4], KEYS[2], ARGV[1])
return 1
