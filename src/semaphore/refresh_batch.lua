-- Refresh many: renew the leases of several semaphores in one call (batched keepalive), each on
-- its own: a lease whose renewal Redis refuses (`OOM`, a key of the wrong type) fails alone.
--
-- KEYS: the prelude's first 7 keys of each lease's semaphore (not the void marks), lease after lease (all in one hash slot
-- on a Cluster; any keys on a single Redis).
-- ARGV: per lease, its token and ttl ms (0 reuses the acquisition ttl).
--
-- Returns per lease, in order, the new remaining ttl in ms, -1 when the token holds no unexpired
-- lease, or the text of the error its renewal raised.
local now = clock()
local out = {}
for i = 1, #KEYS / 7 do
  local k = (i - 1) * 7
  -- The prelude's functions read these locals: point them at this lease's semaphore.
  H, D, L, Q, W, F, C = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5],
    KEYS[k + 6], KEYS[k + 7]
  local ok, ttl = pcall(refresh_lease, ARGV[2 * i - 1], tonumber(ARGV[2 * i]), 0, now)
  if ok then
    out[i] = ttl
  else
    out[i] = type(ttl) == 'table' and ttl.err or tostring(ttl)
  end
end
return out
