-- Renew (or just check) many holds in one round trip: the watchdog's batch.
-- KEYS[i]      lock hash i
-- ARGV[i]      owner field of hold i
-- ARGV[n + i]  lease in ms for hold i, or "0" to only check that it is still held
-- Reply: an array with 1 where hold i is still held, 0 where it is gone.
-- Renewal never shortens an expiry (a fixed lease of the same owner may reach further).
-- pcall: one key that changed type must not fail the renewal of every other lock.
local n = #KEYS
local result = {}
for i = 1, n do
    local held = redis.pcall('hexists', KEYS[i], ARGV[i])
    if held == 1 then
        local lease = tonumber(ARGV[n + i])
        if lease > 0 and redis.call('pttl', KEYS[i]) < lease then
            redis.call('pexpire', KEYS[i], lease)
        end
        result[i] = 1
    else
        result[i] = 0
    end
end
return result
