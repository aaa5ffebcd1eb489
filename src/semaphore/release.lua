-- Release: give a permit lease back and wake the waiters.
--
-- ARGV[1] token   ARGV[2] '1' for the clean-up of a grant whose caller never saw it, named by the
--                 token its call proposed: the lease's own (the call granted it) or a retry's (the
--                 call got it again by its idempotency key, a claim this withdraws). The lease is
--                 released once the call that granted it and every retry that claimed it were
--                 cleaned up so; kept while one of them may have reached its caller. '0' otherwise
-- ARGV[3] how long (ms) the token stays void (void.lua), after a call whose reply never came;
--         '0' for none
--
-- Returns 1 when the lease was still held, 0 when it had already expired (its permits are
-- reclaimed now) or the token is unknown, -1 when it was kept as claimed.
local now = clock()
local unclaimed_only, void_ms = ARGV[2] == '1', tonumber(ARGV[3])
if void_ms > 0 then
  void(V, ARGV[1], now, void_ms)
end
local token, withdrawn = ARGV[1], false
if unclaimed_only then
  local claimed = redis.call('HGET', D, 'r:' .. token)
  if claimed then
    redis.call('HDEL', D, 'r:' .. token)
    if redis.call('HINCRBY', D, 'c:' .. claimed, -1) <= 0 then
      redis.call('HDEL', D, 'c:' .. claimed)
    end
    local kept = {}
    for _, claimer in ipairs(claimers_of(claimed)) do
      if claimer ~= token then
        kept[#kept + 1] = claimer
      end
    end
    redis.call('HSET', D, 'R:' .. claimed, table.concat(kept, ' '))
    token, withdrawn = claimed, true
  end
end
local expiry = redis.call('ZSCORE', H, token)
if not expiry then
  return 0
end
if unclaimed_only and tonumber(expiry) > now then
  -- Kept while a claim stands, or (a retry's claim withdrawn) while the granting call may have
  -- reached its caller. Claims come only with an idempotency key, whose lease's fields
  -- drop_holder clears.
  local claimed_now = redis.call('HEXISTS', D, 'c:' .. token) == 1
  if withdrawn then
    if claimed_now or redis.call('HEXISTS', D, 'x:' .. token) == 0 then
      return -1
    end
  elseif claimed_now then
    redis.call('HSET', D, 'x:' .. token, 1)
    return -1
  end
end
drop_holder(token)
redis.pcall(PUBLISH, C, 'released')
touch(now)
if tonumber(expiry) <= now then
  return 0
end
return 1
