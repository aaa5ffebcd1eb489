-- Abandon: a waiter stops waiting (it gave up, timed out, or its caller left). When that lets
-- others go ahead, wake them at once: the new head of the fair queue when it can be granted (a
-- waiter leaving the head, or an exclusive one leaving, can unblock those behind it); the waiters
-- without a place when the queue is now empty; the shared waiters a waiting writer kept out when
-- it was the last one.
--
-- KEYS: the prelude's eight.
-- ARGV[1] waiter id   ARGV[2] how long (ms) the waiter id stays void (void.lua), after a call
--                     whose reply never came; '0' for none
--
-- Returns 1 when the waiter was registered, 0 when it was not.
local id, void_ms = ARGV[1], tonumber(ARGV[2])
local now = clock()
if void_ms > 0 then
  void(K.void, id, now, void_ms)
end

local head = redis.call('ZRANGE', K.queue, 0, 0)
local was_head = head[1] == 'x' .. id or head[1] == 's' .. id
local exclusive_waiter = redis.call('ZSCORE', K.queue, 'x' .. id)
  or redis.call('ZSCORE', K.writers, id)
local registered = redis.call('ZSCORE', K.waiters, id)
local queued = drop_waiter(id)
if queued then
  if was_head or exclusive_waiter or redis.call('ZCARD', K.queue) == 0 then
    wake(now, false)
  end
elseif exclusive_waiter and redis.call('ZCOUNT', K.writers, '(' .. now, '+inf') == 0
    and not exclusive(now) then
  wake(now, false)
end
touch_waiters(now)
if registered or queued then
  return 1
end
return 0
