-- Take every free permit of a semaphore at once (drainPermits).
-- KEYS[1]  the counter
-- Reply: the count there was; 0 when the counter is absent, which stays absent. A negative
--        count is raised to 0 and returned as it was, as Redisson does.
-- SET, like Redisson's: it clears any expiry on the counter. Nothing is published: no permit
-- became free.
local value = redis.call('get', KEYS[1])
if not value then
    return 0
end
if not string.match(value, '^%-?%d+$') or #value > 15 then
    return redis.error_reply('WRONGTYPE the semaphore key holds a string that is not a permit count')
end
redis.call('set', KEYS[1], '0')
return tonumber(value)
