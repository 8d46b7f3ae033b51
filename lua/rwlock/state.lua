-- Read a read/write lock's mode, size and one owner's counts in one atomic step.
-- KEYS[1]  the lock hash
-- ARGV[1]  reader field "<uuid>:<n>"
-- ARGV[2]  writer field "<uuid>:<n>:write"
-- Reply: {mode or "", hlen, reader count, writer count} (counts 0 when absent).
-- A key of another type fails with WRONGTYPE.
local mode = redis.call('hget', KEYS[1], 'mode') or ''
local reads = tonumber(redis.call('hget', KEYS[1], ARGV[1]) or '0') or 0
local writes = tonumber(redis.call('hget', KEYS[1], ARGV[2]) or '0') or 0
return {mode, redis.call('hlen', KEYS[1]), reads, writes}
