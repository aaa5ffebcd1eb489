-- Release: end one hold, the one whose token is given. When it was the last live hold of its
-- lease, the lease ends; when that frees the lock for those waiting, wake them: the fair queue's
-- head (by a message addressed to it), or with nobody queued every waiter on every Baton at once.
--
-- KEYS: the prelude's eight.
-- ARGV[1] token   ARGV[2] '1' for the clean-up of a grant whose caller never saw it, named by the
--                 token its call proposed: the hold's own (the call granted it) or a retry's (the
--                 call got it again by its idempotency key, a claim this withdraws). The hold is
--                 released once the call that granted it and every retry that claimed it were
--                 cleaned up so; kept while one of them may have reached its caller. '0' otherwise
-- ARGV[3] how long (ms) the token stays void (void.lua), after a call whose reply never came;
--         '0' for none
--
-- Returns {1, live holds left in the lease} when the token held the lock, {0, 0} when it did not
-- (already released, expired, or unknown), {-1, live holds} when it was kept as claimed.
local token, unclaimed_only, void_ms = ARGV[1], ARGV[2] == '1', tonumber(ARGV[3])
local now = clock()
if void_ms > 0 then
  void(K.void, token, now, void_ms)
end
local withdrawn = nil
if unclaimed_only then
  local claimed = redis.call('HGET', K.state, 'c:' .. token)
  if claimed then
    redis.call('HDEL', K.state, 'c:' .. token)
    withdrawn, token = token, claimed
  end
end
local id = redis.call('HGET', K.state, 't:' .. token)
if not id then
  return {0, 0}
end
local lease = lease_of(id)
if not lease then
  redis.call('HDEL', K.state, 't:' .. token)
  return {0, 0}
end
local h, i = hold_of(lease, token, now)
if h and unclaimed_only then
  if withdrawn then
    h[CLAIMS] = math.max(0, h[CLAIMS] - 1)
    local claimers = h[CLAIMERS] or {}
    for n, claimer in ipairs(claimers) do
      if claimer == withdrawn then
        table.remove(claimers, n)
        break
      end
    end
  else
    h[LOST] = 1
  end
  if h[CLAIMS] > 0 or h[LOST] ~= 1 then
    redis.call('HSET', K.state, 'l:' .. id, cmsgpack.pack(lease))
    return {-1, #lease.holds}
  end
end
if i then
  forget_hold(lease.holds[i])
  table.remove(lease.holds, i)
end
local left = save_lease(id, lease, now)
touch_leases(now)
if not left and (lease.mode == 'x' or live_shared(now) == 0) then
  wake(now, true)
end
if not h then
  return {0, 0}
end
return {1, left and #lease.holds or 0}
