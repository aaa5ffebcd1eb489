-- Void marks, shared by every leased primitive (concatenated in front of its prelude).
--
-- A script call whose reply never came (it timed out) may still run later: Redis may hold it in
-- a paused server's input buffer, or read it after a clean-up sent on another connection. So the
-- clean-up that follows such a call (releasing the grant its caller never saw, removing the
-- waiter it may have registered) marks the call's token and waiter id void, in a sorted set of
-- id -> until when (ms, Redis time). An acquisition script that meets a void token or waiter id
-- changes nothing: a late call can never grant a lease, or register a waiter, after the clean-up
-- meant to undo it has run.

-- Whether the token `token` or the waiter id `waiter` ('' for none) is void at `now`.
local function voided(key, token, waiter, now)
  local t = redis.call('ZSCORE', key, token)
  if t and tonumber(t) > now then
    return true
  end
  if waiter ~= '' then
    local w = redis.call('ZSCORE', key, waiter)
    if w and tonumber(w) > now then
      return true
    end
  end
  return false
end

-- Marks `id` void for `keep` ms from `now`, forgets marks that have lapsed, and keeps the set
-- until its last mark lapses.
local function void(key, id, now, keep)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('ZADD', key, 'GT', now + keep, id)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', key, math.max(tonumber(last[2]) - now, 1))
end
