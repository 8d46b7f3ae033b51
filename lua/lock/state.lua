-- Read a lock's remaining lease and its owners in one atomic step.
-- KEYS[1]  the lock hash
-- Reply: {-2} when there is no such key, else {pttl_ms, {field, count, ...}}.
-- Refuses a key that is not a lock hash (another type, or a hash without an expiry).
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
    return {-2}
end
local pttl = redis.call('pttl', KEYS[1])
if kind ~= 'hash' or pttl < 0 then
    return redis.error_reply('WRONGTYPE key is a ' .. kind .. ' without the expiry every lock has; not a lock')
end
return {pttl, redis.call('hgetall', KEYS[1])}
