-- Campaign: elect the candidate when nobody leads and it is its turn (it is the head of the
-- queue, or nobody is queued), writing a new term and its value with the grant; or else register
-- it in the queue, in the order candidates joined, and say what keeps it out.
--
-- KEYS: the prelude's seven.
-- ARGV[1] token of the leadership to grant   ARGV[2] ttl ms
-- ARGV[3] candidate id ('' when it does not wait)   ARGV[4] wait left ms
-- ARGV[5] registration lease ms   ARGV[6] term retention ms   ARGV[7] value
--
-- Returns {1, token, term, remaining ms} when elected; {0, ms left on the leader's lease (-2:
-- nobody leads), ms until the state may change without a message (-1: never)} when not.
local token, ttl, id, wait_ms = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local lease_ms, retention, value = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]

local now, now_us = clock()
-- A late call whose clean-up already ran (void.lua) changes nothing.
if voided(K.void, token, id, now) then
  return {0, -2, -1}
end
local moved = purge(now)
local leader = current(now)

-- Registration: a place at the end of the queue the first time, kept while it is renewed.
if id ~= '' and wait_ms > 0 then
  if not redis.call('ZSCORE', K.queue, id) then
    local last = redis.call('ZRANGE', K.queue, -1, -1, 'WITHSCORES')
    redis.call('ZADD', K.queue, last[2] and tonumber(last[2]) + 1 or 1, id)
  end
  redis.call('ZADD', K.candidates, now + math.min(lease_ms, wait_ms), id)
end
local first = head(now)
local turn = first == nil or first == id

if turn and not leader then
  -- Terms never go backwards: at least one more than the last one kept, and at least the Redis
  -- clock in microseconds, so they stay increasing after the term key expired or Redis restarted
  -- from an older snapshot.
  local last = tonumber(redis.call('GET', K.term) or '0')
  local term = string.format('%.0f', math.max(last + 1, now_us))
  redis.call('SET', K.term, term, 'PX', math.max(redis.call('PTTL', K.term), ttl + retention))
  redis.call('DEL', K.leader)
  redis.call('HSET', K.leader, 'token', token, 'term', term, 'value', value, 'revision', 0,
             'expiry', now + ttl, 'ttl', ttl)
  redis.call('PEXPIRE', K.leader, ttl)
  if id ~= '' then
    drop_candidate(id)
  end
  touch_candidates(now)
  changed(term)
  return {1, token, term, ttl}
end

-- A head whose registration ended was dropped: the next one need not wait for its expiry.
if moved and not leader then
  wake_head(now)
end
if id ~= '' or moved then
  touch_candidates(now)
end

-- What keeps the candidate out, and when that may change without a message: on its turn, the
-- leader's expiry (a leader whose client and Baton died resigns by expiring); behind the queue,
-- the end of the head's registration, should its Baton stop renewing it.
local remaining, change = -2, -1
if leader then
  remaining = leader.expiry - now
  if turn then
    change = remaining
  end
end
if not turn then
  change = tonumber(redis.call('ZSCORE', K.candidates, first)) - now
end
return {0, remaining, change}
