-- Configure: declares the features of a dictionary (features.lua). An empty dictionary holds no
-- index, so its features are set at once. On a dictionary with terms, the features dropped stop
-- being served and written at once and their keys are deleted in steps (change.lua); RANKED,
-- WORDS and SUBSTRING added are built in steps, one after the other in that order, each served
-- once complete.
--
-- KEYS[1] data (as in add.lua)   KEYS[2] the features hash
-- ARGV[1] the features asked for, as letters in the order 'rws'
--
-- Returns {status, features served, term count, features a change in progress goes to or ''}:
--   0 the dictionary has those features now (set, or already so)
--   2 a change to those features started, or is already under way
--   3 refused: a change to other features is under way (nothing changed)
local data, fkey = KEYS[1], KEYS[2]
local asked = ARGV[1]
local count = redis.call('HLEN', data)
local v = redis.call('HMGET', fkey, 's', 'g')
local served, target = v[1] or ALL_FEATURES, v[2]
if target then
  return { target == asked and 2 or 3, served, count, target }
end
if served == asked or count == 0 then
  redis.call('HSET', fkey, 's', asked)
  return { 0, asked, count, '' }
end
local adding, dropping, keep = '', '', ''
for _, f in ipairs({ 'r', 'w', 's' }) do
  local a, h = has_feature(asked, f), has_feature(served, f)
  if a and not h then
    adding = adding .. f
  elseif h and not a then
    dropping = dropping .. f
  elseif h then
    keep = keep .. f
  end
end
local fields = { 's', keep, 'g', asked }
if dropping ~= '' then
  fields[#fields + 1], fields[#fields + 2] = 'd', dropping
end
if has_feature(adding, 'r') then
  -- The ranked sets are built for the terms up to the cursor (ranking.lua): none yet. Every
  -- lex member sorts after '\1'.
  fields[#fields + 1], fields[#fields + 2], fields[#fields + 3], fields[#fields + 4] = 'b', 'r', 'c', '\1'
elseif has_feature(adding, 'w') then
  -- Every lex member sorts after '\1': the build starts before all of them.
  fields[#fields + 1], fields[#fields + 2], fields[#fields + 3], fields[#fields + 4] = 'b', 'w', 'c', '\1'
elseif has_feature(adding, 's') then
  fields[#fields + 1], fields[#fields + 2], fields[#fields + 3], fields[#fields + 4] = 'b', 's', 'c', ''
end
fields[#fields + 1], fields[#fields + 2] = 'n', '0'
redis.call('HDEL', fkey, 'c', 'dc')
redis.call('HSET', fkey, unpack(fields))
return { 2, keep, count, asked }
