-- Describe: a dictionary's size and declared features. Reads only (flags=no-writes).
--
-- KEYS[1] data (as in add.lua)   KEYS[2] the features hash (features.lua)
--
-- Returns {term count, the declared features as letters, or '' when none were declared (every
-- index is kept), 1 when they were declared else 0}.
local declared = redis.call('HGET', KEYS[2], 's')
return { redis.call('HLEN', KEYS[1]), declared or '', declared and 1 or 0 }
