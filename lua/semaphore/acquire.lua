-- Take permits from a semaphore (Redisson's RSemaphore: a string counter of free permits).
-- KEYS[1]  the counter
-- ARGV[1]  how many permits to take (>= 1)
-- Reply: 1 when they were taken, 0 when fewer are free (nothing changes).
-- A key of another type is refused by GET (WRONGTYPE); a string that is not a count too.
local value = redis.call('get', KEYS[1])
if not value then
    return 0
end
if not string.match(value, '^%-?%d+$') or #value > 15 then
    return redis.error_reply('WRONGTYPE the semaphore key holds a string that is not a permit count')
end
if tonumber(value) < tonumber(ARGV[1]) then
    return 0
end
redis.call('decrby', KEYS[1], ARGV[1])
return 1
