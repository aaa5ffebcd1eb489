-- Shared by every election script (concatenated in front of each one, after void.lua but in
-- leader.lua; see scripts.rs).
--
-- The keys of the election NAME all carry the hash tag {election:NAME}. Every script but the
-- batched renewal takes them all, in this order:
--
--   KEYS[1] leader      hash: the leader's lease (below); expires with it
--   KEYS[2] term        string: the last term issued; outlives every lease by the retention
--   KEYS[3] candidates  sorted set: candidate id -> registration expiry (ms, Redis time)
--   KEYS[4] queue       sorted set: candidate id -> arrival number
--   KEYS[5] turn        pub/sub channel: '@ID' wakes the candidate whose turn it is
--   KEYS[6] changed     pub/sub channel: the term, after every change observers must see
--   KEYS[7] void        sorted set: void tokens and candidate ids -> until when (ms; void.lua)
--                       (channels are declared as keys: they share the hash tag)
--
-- The leader hash holds 'token', 'term', 'value', 'revision' (how many times the value changed
-- in this term), 'expiry' (ms, Redis time) and 'ttl' (ms, the campaign's). It is current only
-- while its expiry is ahead of Redis's clock; the key itself expires at that moment.
local K = {
  leader = KEYS[1], term = KEYS[2], candidates = KEYS[3], queue = KEYS[4], turn = KEYS[5],
  changed = KEYS[6], void = KEYS[7],
}

-- Redis time: milliseconds, and microseconds.
local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end

-- The live leader {token, term, value, revision, expiry, ttl}, or nil.
local function current(now)
  local l = redis.call('HMGET', K.leader, 'token', 'term', 'value', 'revision', 'expiry', 'ttl')
  if l[1] and l[5] and tonumber(l[5]) > now then
    return {token = l[1], term = l[2], value = l[3] or '', revision = tonumber(l[4]) or 0,
            expiry = tonumber(l[5]), ttl = tonumber(l[6]) or 0}
  end
  return nil
end

-- Forgets a candidate; returns whether it was registered.
local function drop_candidate(id)
  local queued = redis.call('ZREM', K.queue, id)
  return redis.call('ZREM', K.candidates, id) + queued > 0
end

-- Forgets the candidates whose registration ended (they left, or their Baton stopped renewing
-- it); returns whether there were any.
local function purge(now)
  local ended = redis.call('ZRANGEBYSCORE', K.candidates, '-inf', now)
  for _, id in ipairs(ended) do
    drop_candidate(id)
  end
  return #ended > 0
end

-- The candidate at the head of the queue, after dropping every place at the head whose
-- registration has ended; nil when nobody waits.
local function head(now)
  while true do
    local first = redis.call('ZRANGE', K.queue, 0, 0)
    if not first[1] then
      return nil
    end
    local registered = redis.call('ZSCORE', K.candidates, first[1])
    if registered and tonumber(registered) > now then
      return first[1]
    end
    drop_candidate(first[1])
  end
end

-- Keeps the candidate keys until the last registration ends; deletes them when none is left.
local function touch_candidates(now)
  local last = redis.call('ZRANGE', K.candidates, -1, -1, 'WITHSCORES')
  if last[2] then
    local keep = math.max(tonumber(last[2]) - now, 1)
    redis.call('PEXPIRE', K.candidates, keep)
    redis.call('PEXPIRE', K.queue, keep)
  else
    redis.call('DEL', K.candidates, K.queue)
  end
end

-- Nobody leads: wakes the candidate whose turn it is, by a message addressed to it.
local function wake_head(now)
  local first = head(now)
  if first then
    redis.pcall(PUBLISH, K.turn, '@' .. first)
  end
end

-- Tells observers the state changed (a new leader, a new value, no leader).
local function changed(term)
  redis.pcall(PUBLISH, K.changed, term)
end
