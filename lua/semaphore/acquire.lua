-- Take permits from a semaphore (Redisson's RSemaphore: a string counter of free permits).
-- KEYS[1]  the counter
-- ARGV[1]  how many permits to take (>= 1)
-- Reply: 1 when they were taken; else nothing changes, and the reply is 0 when no permit is
--        free, -1 when some are but fewer than asked (a smaller request could take them).
-- A key of another type is refused by GET (WRONGTYPE); a string that is not a count too.
local value = redis.call('get', KEYS[1])
if not value then
    return 0
end
if not string.match(value, '^%-?%d+$') or #value > 15 then
    return redis.error_reply('WRONGTYPE the semaphore key holds a string that is not a permit count')
end
local free = tonumber(value)
if free < tonumber(ARGV[1]) then
    if free > 0 then
        return -1
    end
    return 0
end
redis.call('decrby', KEYS[1], ARGV[1])
return 1
