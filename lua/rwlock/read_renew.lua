-- Renew (or just check) many read holds in one round trip: the watchdog's batch, the way
-- Redisson's read-lock renewal does it — every timeout key of the hold, and the hash.
-- KEYS[i]      lock hash i
-- ARGV[i]      reader field "<uuid>:<n>" of hold i
-- ARGV[n + i]  lease in ms for hold i, or "0" to only check that it is still held
-- Reply: an array with 1 where hold i is still held, 0 where it is gone.
-- Hold i's timeout keys are "<prefix>:1" .. "<prefix>:count", prefix = Redisson's
-- suffixName(KEYS[i], field) .. ":rwlock_timeout" (same hash slot as KEYS[i]).
-- Renewal never shortens an expiry (a fixed lease of the same owner may reach further;
-- Redisson sets the hash's expiry to exactly the lease, which can).
-- pcall: one key that changed type must not fail the renewal of every other lock.
local n = #KEYS
local result = {}
for i = 1, n do
    local key, field = KEYS[i], ARGV[i]
    local count = redis.pcall('hget', key, field)
    if type(count) == 'string' and redis.call('hexists', key, 'mode') == 1 then
        local lease = tonumber(ARGV[n + i])
        if lease > 0 then
            local prefix
            if string.find(key, '{', 1, true) then
                prefix = key .. ':' .. field .. ':rwlock_timeout:'
            else
                prefix = '{' .. key .. '}:' .. field .. ':rwlock_timeout:'
            end
            for j = tonumber(count), 1, -1 do
                local ttl = redis.call('pttl', prefix .. j)
                if ttl ~= -2 and ttl < lease then
                    redis.call('pexpire', prefix .. j, ARGV[n + i])
                end
            end
            if redis.call('pttl', key) < lease then
                redis.call('pexpire', key, ARGV[n + i])
            end
        end
        result[i] = 1
    else
        result[i] = 0
    end
end
return result
