-- How many subscribers a lock's channel has, read for the local hand-off (src/baton.rs): more
-- than the reading client's own subscriber means another client may be waiting.
-- KEYS[1]  the lock hash (unread: it routes the call to the node of the channel's slot)
-- ARGV[1]  NUMSUB or SHARDNUMSUB: how the channel's subscribers are counted
-- ARGV[2]  the lock's channel
return redis.call('pubsub', ARGV[1], ARGV[2])[2]
