-- Features: the optional indexes a dictionary keeps (prepended to the scripts that write or read
-- them). The features hash (<base>:f) holds:
--   s  the features served, as letters: 'r' the ranked sets (b:, r:, t:, top), 'w' the words
--      (w:, v), 's' the grams of words (vg:); a dictionary without the hash never declared its
--      features and has every one
--   g  while a change is applied: the features asked for
--   b  while a feature's index is built: its letter ('r', 'w' or 's'), with
--   c  the build's cursor: every term whose lex member sorts at or before it ('r', 'w'), or
--      every vocabulary word at or before it ('s'), is indexed
--   n  terms (or words) the build indexed so far; while RANKED is built, exactly the terms at
--      or before the cursor (writes keep it so), the dictionary the ranked sets hold
--   d  letters of the features whose keys are being deleted
-- Writes index a term (or a word) in a feature being built only when it is at or before the
-- cursor: the build indexes the rest, so the index ends exact whatever writes run meanwhile.
-- While RANKED is built, the ranked sets are those of the dictionary *restricted* to the terms
-- at or before the cursor (ranking.lua): writes maintain them as if the dictionary had only
-- those terms, and each build step adds the next terms to that dictionary as new ones.
local ALL_FEATURES = 'rws'

-- The features of the dictionary whose features hash is `key`, as letters.
local function features_of(key)
  return redis.call('HGET', key, 's') or ALL_FEATURES
end

-- Whether feature letter `f` is one of `features`.
local function has_feature(features, f)
  return string.find(features, f, 1, true) ~= nil
end

-- The first letter of `need` that `features` lacks, or nil.
local function missing_feature(features, need)
  for i = 1, #need do
    local c = string.sub(need, i, i)
    if not has_feature(features, c) then
      return c
    end
  end
  return nil
end

-- The refusal of a query needing feature `f`, which the dictionary whose features hash is `key`
-- lacks: {-1, f, terms indexed so far when its index is being built, 'queued' when a change
-- under way will build it after another feature, else ''}.
local function refusal(key, f)
  local v = redis.call('HMGET', key, 'b', 'n', 'g')
  if v[1] == f then
    return { -1, f, v[2] or '0' }
  end
  return { -1, f, v[3] and has_feature(v[3], f) and 'queued' or '' }
end

-- What a write to the dictionary whose features hash is `key` maintains: a table with
-- served (letters), building (a letter or false), cursor (string or false), dropping (letters),
-- indexed (the 'n' field, a number), changing (whether a change of the features is under way).
local function write_state(key)
  local v = redis.call('HMGET', key, 's', 'b', 'c', 'd', 'n', 'g')
  return { served = v[1] or ALL_FEATURES, building = v[2], cursor = v[3], dropping = v[4] or '',
    indexed = tonumber(v[5] or '0'), changing = v[6] ~= false }
end

-- The features whose keys a write may touch, as letters in the order 'rws': those served, the
-- one being built and those being dropped. Baton declares the keys of the features it planned a
-- step for; a step planned for fewer changes nothing and answers with these (send it again).
local function write_needs(state)
  local s = ''
  for _, f in ipairs({ 'r', 'w', 's' }) do
    if has_feature(state.served, f) or state.building == f or has_feature(state.dropping, f) then
      s = s .. f
    end
  end
  return s
end

-- What a write step tells Baton of the features (the `needs` of its answer): the letters of
-- write_needs, then '+' while a change of the features is under way, so that Baton makes sure
-- some Baton drives it (a driver that died leaves its lease to lapse).
local function write_told(state)
  return write_needs(state) .. (state.changing and '+' or '')
end

-- The features `features` with letter `f` too, in the order 'rws'.
local function with_feature(features, f)
  local out = ''
  for _, x in ipairs({ 'r', 'w', 's' }) do
    if has_feature(features, x) or x == f then
      out = out .. x
    end
  end
  return out
end

-- Whether a write maintains feature `f` for the item (a lex member for 'r' or 'w', a word for 's')
-- `item`: the feature is served, or being built and the build's cursor is at or past the item.
local function maintains(state, f, item)
  if has_feature(state.served, f) then
    return true
  end
  return state.building == f and state.cursor and not lt(state.cursor, item) or false
end
