-- Renew (or just check) many leased holds in one round trip: the watchdog's batch. A hold is
-- one permit, or the permits taken together.
-- KEYS[i]      T of permit i: "{name}:timeout", the zset of taken permits
-- ARGV[i]      the field of hold i: "<client uuid>:<ids>", the 32 hex digits of each id
-- ARGV[n + i]  lease in ms for hold i, or "0" to only check that it is still held
-- Reply: an array with 1 where every permit of hold i is still held, 0 where one is gone
--        (released, reclaimed, or its lease ended).
-- A renewal never shortens a lease. "Now" is the server's clock (TIME).
-- pcall: one key that changed type must not fail the renewal of every other permit.
local SENTINEL = 922337203685477
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local n = #KEYS
local result = {}
for i = 1, n do
    local hexes = string.match(ARGV[i], '([^:]*)$')
    local held = {}
    for at = 1, #hexes, 32 do
        local hex = string.sub(hexes, at, at + 31)
        local id = (string.gsub(hex, '..', function(cc) return string.char(tonumber(cc, 16)) end))
        local score = redis.pcall('zscore', KEYS[i], id)
        if type(score) == 'string' and tonumber(score) > now then
            held[#held + 1] = {id, tonumber(score)}
        else
            held = nil
            break
        end
    end
    if held then
        local lease = tonumber(ARGV[n + i])
        if lease > 0 then
            local expiry = math.min(now + lease, SENTINEL - 1)
            for _, permit in ipairs(held) do
                if expiry > permit[2] then
                    redis.call('zadd', KEYS[i], expiry, permit[1])
                end
            end
        end
        result[i] = 1
    else
        result[i] = 0
    end
end
return result
