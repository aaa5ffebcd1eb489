-- Abandon: a candidate stops waiting (its stream closed, or an error ended its wait). When it
-- was the head of the queue and nobody leads, the next candidate's turn comes at once.
--
-- KEYS: the prelude's seven.
-- ARGV[1] candidate id   ARGV[2] how long (ms) the candidate id stays void (void.lua), after a
--                        call whose reply never came; '0' for none
--
-- Returns 1 when the candidate was registered, 0 when it was not.
local id = ARGV[1]
local now = clock()
if tonumber(ARGV[2]) > 0 then
  void(K.void, id, now, tonumber(ARGV[2]))
end
local was_head = head(now) == id
local registered = drop_candidate(id)
if was_head and not current(now) then
  wake_head(now)
end
touch_candidates(now)
if registered then
  return 1
end
return 0
