-- Release holds of one owner; at zero delete the lock and wake one waiter per process.
-- KEYS[1]  the lock hash
-- ARGV[1]  owner field
-- ARGV[2]  how many holds to release at most (1 for an unlock)
-- ARGV[3]  how many holds to keep at least (0 for an unlock; a settle trims down to the
--          holds its client still accounts for)
-- ARGV[4]  unlock message ("0")
-- ARGV[5]  publish command: PUBLISH or SPUBLISH
-- ARGV[6]  the lock's channel (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: -1 when the owner holds nothing, 0 when the lock was released, else the owner's
--        remaining count.
-- The expiry is left alone while holds remain: nothing ever shortened it below what they
-- rely on (Redisson re-applies its last lease here, which could).
local count = redis.call('hget', KEYS[1], ARGV[1])
if not count then
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
redis.call(ARGV[5], ARGV[6], ARGV[4])
return 0
