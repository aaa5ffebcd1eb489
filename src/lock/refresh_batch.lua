-- Refresh many holds in one call (the keepalive of many streams at once), each on its own: one
-- hold whose renewal Redis refuses (`OOM`, a key of the wrong type) fails alone.
--
-- KEYS: per hold, its lock's state, leases, waiters and channel keys (four per hold).
-- ARGV: per hold, its token and ttl ms (0 reuses the ttl the hold was acquired with).
--
-- Returns per hold, in order, its new remaining ttl in ms, 0 when that token no longer holds the
-- lock, or the text of the error its renewal raised (`OOM ...` when `maxmemory` is reached).
local now = clock()
local renewed = {}
for i = 1, #ARGV / 2 do
  -- The prelude's functions read K: point it at this hold's lock.
  K.state, K.leases, K.waiters, K.channel =
    KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local ok, ttl = pcall(refresh_hold, ARGV[2 * i - 1], tonumber(ARGV[2 * i]), 0, now)
  if ok then
    renewed[i] = math.max(ttl, 0)
  else
    renewed[i] = type(ttl) == 'table' and ttl.err or tostring(ttl)
  end
end
return renewed
