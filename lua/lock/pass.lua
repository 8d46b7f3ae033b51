-- The baton pass: release an owner's last hold and give the lock to the next waiter of the
-- same client in the same step, unless another client may be waiting for it.
-- KEYS[1]  the lock hash
-- ARGV[1]  releasing owner field
-- ARGV[2]  next owner field
-- ARGV[3]  the next owner's lease in milliseconds
-- ARGV[4]  how many subscribers the channel may have for a pass (the passing client's own)
-- ARGV[5]  NUMSUB or SHARDNUMSUB: how the channel's subscribers are counted
-- ARGV[6]  unlock message ("0")
-- ARGV[7]  publish command: PUBLISH or SPUBLISH
-- ARGV[8]  the lock's channel (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: -1 when the owner holds nothing, -2 when the lock was passed, 0 when it was
--        released as by the release script (message published), else the owner's remaining
--        count.
-- The hash has one owner field at every instant: to anyone else, a pass is a held lock
-- whose holder changed.
local count = redis.call('hget', KEYS[1], ARGV[1])
if not count then
    return -1
end
count = tonumber(count)
if count > 1 then
    return redis.call('hincrby', KEYS[1], ARGV[1], -1)
end
-- Counted before anything is written: a user whose ACL refuses it gets an error with no
-- effect, and the client releases the ordinary way.
local subscribers = redis.call('pubsub', ARGV[5], ARGV[8])[2]
redis.call('del', KEYS[1])
if subscribers <= tonumber(ARGV[4]) then
    -- The commands the release and acquire scripts use, so no other permission is needed.
    -- A node migrating the slot away refuses a command on a key it no longer has (the one
    -- just deleted): the pass then ends as an ordinary release, message and all.
    if type(redis.pcall('hincrby', KEYS[1], ARGV[2], 1)) == 'number' then
        redis.call('pexpire', KEYS[1], ARGV[3])
        return -2
    end
end
redis.call(ARGV[7], ARGV[8], ARGV[6])
return 0
