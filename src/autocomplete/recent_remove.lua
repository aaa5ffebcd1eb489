-- Remove: delete items from a recent list; unknown ones are skipped. The list's expiry is left
-- as it is; an emptied list leaves no key.
--
-- KEYS[1] order   KEYS[2] items   (as in recent_record.lua)
-- ARGV[1..] ids
--
-- Returns {removed, size}.
local removed = redis.call('ZREM', KEYS[1], unpack(ARGV))
redis.call('HDEL', KEYS[2], unpack(ARGV))
return { removed, redis.call('ZCARD', KEYS[1]) }
