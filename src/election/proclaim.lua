-- Proclaim: the leader whose token is given changes its value, in its term; observers are told
-- when the value changed.
--
-- KEYS: the prelude's seven.
-- ARGV[1] token   ARGV[2] value
--
-- Returns {1, term, revision} when the token leads (the revision is one more when the value
-- changed), {0} when it does not.
local token, value = ARGV[1], ARGV[2]
local now = clock()
local leader = current(now)
if not leader or leader.token ~= token then
  return {0}
end
local revision = leader.revision
if leader.value ~= value then
  revision = redis.call('HINCRBY', K.leader, 'revision', 1)
  redis.call('HSET', K.leader, 'value', value)
  changed(leader.term)
end
return {1, leader.term, revision}
