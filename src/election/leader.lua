-- Leader: read an election's state without changing anything (flags=no-writes).
--
-- KEYS: the prelude's seven.
--
-- Returns {1, term, value, revision, remaining ms, last term issued, candidates} while someone
-- leads, {0, '0', '', 0, -2, last term issued ('0': none kept), candidates} otherwise.
local now = clock()
local leader = current(now)
local last = redis.call('GET', K.term) or '0'
local candidates = redis.call('ZCOUNT', K.candidates, '(' .. now, '+inf')
if leader then
  return {1, leader.term, leader.value, leader.revision, leader.expiry - now, last, candidates}
end
return {0, '0', '', 0, -2, last, candidates}
