-- Resign: end the leadership whose token is given, tell observers there is no leader, and wake
-- the candidate whose turn it is.
--
-- KEYS: the prelude's seven.
-- ARGV[1] token   ARGV[2] how long (ms) the token stays void (void.lua), after a call whose reply
--                 never came; '0' for none
--
-- Returns 1 when the token led, 0 when it did not (already resigned, expired, or unknown).
local now = clock()
if tonumber(ARGV[2]) > 0 then
  void(K.void, ARGV[1], now, tonumber(ARGV[2]))
end
local leader = current(now)
if not leader or leader.token ~= ARGV[1] then
  return 0
end
redis.call('DEL', K.leader)
changed(leader.term)
wake_head(now)
touch_candidates(now)
return 1
