-- Redis's clock, read on the node of KEYS[1] (not touched: it only routes the call to the node
-- whose clock the checks on that key will read).
--
-- Returns the Redis time in microseconds since the Unix epoch.
local t = redis.call('TIME')
return tonumber(t[1]) * 1000000 + tonumber(t[2])
