-- Release read holds of one owner (Redisson's read-unlock, for up to `max` holds at once).
-- KEYS[1]  the lock hash
-- KEYS[2]  this owner's timeout-key prefix "{name}:<uuid>:<n>:rwlock_timeout"
-- KEYS[3]  the key prefix of every owner's timeout keys: "{name}" (the name itself when it
--          has a "{"), so owner f's hold i has the key "<KEYS[3]>:<f>:rwlock_timeout:<i>"
-- ARGV[1]  owner field "<uuid>:<n>"
-- ARGV[2]  how many holds to release at most (1 for an unlock)
-- ARGV[3]  how many holds to keep at least (0 for an unlock)
-- ARGV[4]  read-unlock message ("0")
-- ARGV[5]  publish command: PUBLISH or SPUBLISH
-- ARGV[6]  the lock's channel "redisson_rwlock:{name}"
--          (an argument, not a key: see `lua_script!` in src/conn.rs)
-- Reply: -1 when the owner holds no read hold (or the key is no read/write lock), else the owner's remaining count (0: none).
--
-- As Redisson: releasing hold i deletes the timeout key "<KEYS[2]>:i" of the highest index;
-- then, while other fields remain, the hash's expiry becomes the longest remaining timeout key
-- of any owner (readers with expired timeout keys are dead and do not count). If none is
-- left in read mode, the lock is deleted and "0" published; in write mode (the writer's own
-- read holds) the writer keeps it. Two differences about expiries (never about what is
-- stored): the remaining holds of this owner keep the longest lease of the
-- holds released (Redisson's keys are per count, not per hold, so it can cut a hold short),
-- and in write mode the expiry is only ever extended (it is the writer's lease too).
-- One addition to what is published: when the expiry in read mode comes down, the new
-- expiry is published negated, "-<ms>" (Redisson's waiters ignore every number but 0 and 1),
-- so waiters parked until the old, later expiry retry when the lock's lease really ends.
-- Nothing is published when the expiry stays (the usual case while readers come and go).
local mode = redis.call('hget', KEYS[1], 'mode')
local count = redis.call('hget', KEYS[1], ARGV[1])
if not mode or not count then
    return -1
end
count = tonumber(count)
-- A TTL read back as a Lua number, written out as whole milliseconds: Redis formats a large
-- Lua number with an exponent, which PEXPIRE and SET PX refuse (a MAX_LEASE hold).
local function millis(ms)
    return string.format('%d', ms)
end
local release = math.min(tonumber(ARGV[2]), count - tonumber(ARGV[3]))
if release <= 0 then
    return count
end
local remaining = count - release
local longest = -3
for i = remaining + 1, count do
    local key = KEYS[2] .. ':' .. i
    longest = math.max(longest, redis.call('pttl', key))
    redis.call('del', key)
end
if remaining > 0 then
    redis.call('hset', KEYS[1], ARGV[1], remaining)
    local top = KEYS[2] .. ':' .. remaining
    if longest > 0 and redis.call('pttl', top) < longest then
        redis.call('set', top, 1, 'px', millis(longest))
    end
else
    redis.call('hdel', KEYS[1], ARGV[1])
end
if redis.call('hlen', KEYS[1]) > 1 then
    local max_left = -3
    for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
        local n = tonumber(redis.call('hget', KEYS[1], field))
        if n then
            for i = n, 1, -1 do
                max_left = math.max(max_left,
                    redis.call('pttl', KEYS[3] .. ':' .. field .. ':rwlock_timeout:' .. i))
            end
        end
    end
    if mode == 'write' then
        if max_left > redis.call('pttl', KEYS[1]) then
            redis.call('pexpire', KEYS[1], millis(max_left))
        end
        return remaining
    end
    if max_left > 0 then
        local before = redis.call('pttl', KEYS[1])
        redis.call('pexpire', KEYS[1], millis(max_left))
        if max_left < before then
            -- Waiters park until the expiry they last read: tell them it came closer.
            redis.call(ARGV[5], ARGV[6], '-' .. millis(max_left))
        end
        return remaining
    end
end
redis.call('del', KEYS[1])
redis.call(ARGV[5], ARGV[6], ARGV[4])
return 0
