-- Configure: declares the features of a dictionary (features.lua), which may change only while
-- the dictionary has no term: its indexes then hold nothing to build or to drop, and every write
-- step reads the features it applies in the same atomic call, so no term can be indexed under
-- other features than the dictionary's.
--
-- KEYS[1] data (as in add.lua)   KEYS[2] the features hash
-- ARGV[1] the features asked for, as letters in the order 'rws'
--
-- Returns {0, features, term count} when the dictionary has those features now (set, or already
-- so), or {1, features, term count} when it has terms and other features (nothing changed).
local data, features = KEYS[1], KEYS[2]
local asked = ARGV[1]
local count = redis.call('HLEN', data)
local current = features_of(features)
if current ~= asked and count > 0 then
  return { 1, current, count }
end
redis.call('HSET', features, 's', asked)
return { 0, asked, count }
