-- Abandon: a waiter stops waiting (gave up, timed out, or its caller left).
--
-- ARGV[1] waiter id   ARGV[2] how long (ms) the waiter id stays void (void.lua), after a call
--                     whose reply never came; '0' for none
--
-- Returns 1 when it was registered. When it was a queued fair waiter, the waiters behind it (and
-- any it was holding back) are woken to look again.
if tonumber(ARGV[2]) > 0 then
  void(V, ARGV[1], clock(), tonumber(ARGV[2]))
end
local queued = redis.call('ZSCORE', Q, ARGV[1])
local registered = redis.call('ZSCORE', W, ARGV[1])
drop_waiter(ARGV[1])
if queued and redis.call('ZCARD', W) > 0 then
  redis.pcall(PUBLISH, C, 'next')
end
if registered or queued then
  return 1
end
return 0
