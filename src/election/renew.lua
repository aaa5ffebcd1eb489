-- Renew many leaderships in one call (the keepalive of many Campaign streams at once), each on
-- its own: one whose renewal Redis refuses (`OOM`, a key of the wrong type) fails alone. The
-- term key is kept for the retention past the renewed lease.
--
-- KEYS: per leadership, its election's leader and term keys (two per leadership).
-- ARGV[1] term retention ms; then per leadership, its token and ttl ms (0: its campaign's ttl).
--
-- Returns per leadership, in order, its new remaining ttl in ms, 0 when that token no longer
-- leads, or the text of the error its renewal raised.
local now = clock()
local retention = tonumber(ARGV[1])

local function renew(token, ttl)
  local leader = current(now)
  if not leader or leader.token ~= token then
    return 0
  end
  if ttl == 0 then
    ttl = leader.ttl
  end
  redis.call('HSET', K.leader, 'expiry', now + ttl)
  redis.call('PEXPIRE', K.leader, ttl)
  local keep = redis.call('PTTL', K.term)
  if keep == -2 then
    redis.call('SET', K.term, leader.term, 'PX', ttl + retention)
  elseif keep < ttl + retention then
    redis.call('PEXPIRE', K.term, ttl + retention)
  end
  return ttl
end

local renewed = {}
for i = 1, #KEYS / 2 do
  -- The prelude's functions read K: point it at this leadership's election.
  K.leader, K.term = KEYS[2 * i - 1], KEYS[2 * i]
  local ok, ttl = pcall(renew, ARGV[2 * i], tonumber(ARGV[2 * i + 1]))
  if ok then
    renewed[i] = ttl
  else
    renewed[i] = type(ttl) == 'table' and ttl.err or tostring(ttl)
  end
end
return renewed
