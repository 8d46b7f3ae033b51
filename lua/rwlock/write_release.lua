-- Release write holds of one owner (Redisson's write-unlock, for up to `max` holds at once).
-- KEYS[1]  the lock hash
-- ARGV[1]  writer field "<uuid>:<n>:write"
-- ARGV[2]  how many holds to release at most (1 for an unlock)
-- ARGV[3]  how many holds to keep at least (0 for an unlock)
-- ARGV[4]  write-unlock message ("1": wakes every waiter, readers may all get in)
-- ARGV[5]  publish command: PUBLISH or SPUBLISH
-- ARGV[6]  the lock's channel "redisson_rwlock:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: -1 when the owner does not hold the write lock, else its remaining count (0: none).
--
-- At count 0 the writer field goes. If only "mode" is left, the lock is deleted and "1"
-- published. Otherwise the writer still holds read holds of its own: the lock is downgraded to
-- read mode, its expiry unchanged, and "1" published too, so waiting readers get in now
-- (Redisson publishes nothing there: its readers wait until their lease-bounded wait ends).
-- A partial release leaves the expiry alone (Redisson re-applies its lease here, which could
-- shorten it). The client also sends this script, with ARGV[3] = the holds it still accounts
-- for, to remove what is left of a write hold whose lease ended while read holds kept the
-- hash alive.
if redis.call('hget', KEYS[1], 'mode') ~= 'write' then
    return -1
end
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
redis.call('hdel', KEYS[1], ARGV[1])
if redis.call('hlen', KEYS[1]) == 1 then
    redis.call('del', KEYS[1])
    redis.call(ARGV[5], ARGV[6], ARGV[4])
else
    redis.call('hset', KEYS[1], 'mode', 'read')
    redis.call(ARGV[5], ARGV[6], ARGV[4])
end
return 0
