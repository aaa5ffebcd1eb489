-- Scores: whether the increments of a batch keep every score in range, checked before the
-- batch's first step so that a batch with one entry out of range is refused whole (each step
-- checks its own entries again, against what other writers did meanwhile).
--
-- KEYS[1] data   KEYS[2] the batch's record, when ARGV[1] is not ''   (as in add.lua)
-- ARGV[1] the batch's fingerprint, or ''
-- ARGV[2] largest absolute score allowed
-- ARGV[3..] per entry of the terms that have an increment, in batch order: id, score op ('' keep,
--           's' set, 'i' add), score
--
-- Returns 0, or the entry (1-based, among those given) whose resulting score would be out of
-- range. A batch the record shows as begun passed this check when it began: 0.
local data, fingerprint, max_score = KEYS[1], ARGV[1], tonumber(ARGV[2])
if fingerprint ~= '' and redis.call('LLEN', KEYS[2]) > 1
    and redis.call('LINDEX', KEYS[2], 0) == fingerprint then
  return 0
end
local ids, seen = {}, {}
for at = 3, #ARGV, 3 do
  if not seen[ARGV[at]] then
    seen[ARGV[at]] = true
    ids[#ids + 1] = ARGV[at]
  end
end
local scores = {}
for first = 1, #ids, 1000 do
  local last = math.min(first + 999, #ids)
  local got = redis.call('HMGET', data, unpack(ids, first, last))
  for i = first, last do
    local v = got[i - first + 1]
    scores[ids[i]] = v and tonumber(string.sub(v, 1, string.find(v, '\0', 1, true) - 1)) or 0
  end
end
local n = 0
for at = 3, #ARGV, 3 do
  n = n + 1
  local id, op = ARGV[at], ARGV[at + 1]
  if op == 's' then
    scores[id] = tonumber(ARGV[at + 2])
  elseif op == 'i' then
    scores[id] = scores[id] + tonumber(ARGV[at + 2])
  end
  if not (scores[id] >= -max_score and scores[id] <= max_score) then
    return n
  end
end
return 0
