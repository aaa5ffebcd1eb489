-- Change: one bounded step of a change of a dictionary's features (configure.lua), run by the
-- one Baton holding the change's lease. Baton reads what the step covers (a few terms, words or
-- sets) and computes their words and grams; the step checks that the state and the range it
-- covers are still what Baton read (else it changes nothing and answers 0: read again), then
-- indexes or deletes them.
--
-- KEYS[1] data   KEYS[2] vocab   KEYS[3] heavy   KEYS[4] top   KEYS[5] features (as in add.lua)
-- KEYS[6] the change's lease (a string: the driving Baton's id, with a ttl)
-- KEYS[7..] every other key the step touches
-- ARGV[1] base   ARGV[2] the driver's id   ARGV[3] the lease's ttl (ms)   ARGV[4] the step:
--   'release': the driver stops; the lease is deleted if it holds it ({1}), nothing else changes
--   'drop-r', names...: delete these ranked sets (fields of heavy), and the top set once none is
--        left
--   'drop-w', k, words (k), grams...: delete the postings of these first k vocabulary words and
--        the words, and these gram sets (when SUBSTRING goes too)
--   'drop-s', cursor, last, grams...: delete these gram sets, of the vocabulary words after the
--        cursor up to last ('' when no word is left)
--   'build-r', heavy, max depth, top, deep (as add.lua's ARGV[2], [4], [5], [6]), cursor, room,
--        wide ('1' or ''), k, then k lex members: add these k terms, the first after the cursor
--        in the cursor's lex set (k = 0: none is left there), to the ranked sets as new terms of
--        the dictionary they hold, and move the cursor to the last (ranking.lua; room and wide as
--        add.lua's ARGV[11] and ARGV[7], a step of one term being one of one entry)
--   'build-w', cursor, k, then per term: lex member, word count, words: index these k terms,
--        the first after the cursor in the cursor's lex set (k = 0: none is left there)
--   'build-s', cursor, k, then per word: word, gram count, grams: index these k vocabulary
--        words, the first after the cursor
--
--
-- Returns {1, its Redis time in microseconds (elapsed)} when the step was applied ({1, that
-- time, work done, terms indexed} for build-r, the work in add.lua's units), {0} when the state
-- or the range changed since Baton read them (nothing changed), {-2} when another driver holds
-- the lease, {2} when no change is under way (the lease is released); build-r: {3, fits} when
-- the step would do more work than its room (its first `fits` terms would not, and the term
-- after them brings that work: ranking.lua), {4} when it would make the ranked sets' dictionary
-- pass `heavy` terms (send it again with wide set and every lex set and first-byte ranked set
-- declared); nothing changed in either case.
local data, vocab, heavy_set, top, fkey, lease = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local base, owner, ttl, op = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- The lease is taken by the first step of a driver when no other holds it, and renewed by each.
local holder = redis.call('GET', lease)
if holder and holder ~= owner then
  return { -2 }
end
if op == 'release' then
  -- The driver stops (its Baton shuts down): the lease goes, the change stays under way.
  if holder then
    redis.call('DEL', lease)
  end
  return { 1, elapsed() }
end
local st = redis.call('HMGET', fkey, 's', 'g', 'b', 'c', 'n', 'd', 'dc')
local served, target, building, cursor = st[1] or ALL_FEATURES, st[2], st[3], st[4]
local indexed, dropping, drop_cursor = tonumber(st[5] or '0'), st[6] or '', st[7] or ''
if not target then
  redis.call('DEL', lease)
  return { 2 }
end
redis.call('SET', lease, owner, 'PX', ttl)

-- Ends the change once nothing is left to build or drop.
local function settle()
  local v = redis.call('HMGET', fkey, 'b', 'd')
  if not v[1] and not v[2] then
    redis.call('HDEL', fkey, 'g', 'n', 'c', 'dc')
  end
end

-- Takes letter f out of the features being dropped.
local function dropped(f)
  local left = string.gsub(dropping, f, '')
  if left == '' then
    redis.call('HDEL', fkey, 'd', 'dc')
  else
    redis.call('HSET', fkey, 'd', left)
  end
  dropping = left
  settle()
end

-- The key <base>:<name>, checked against the declared keys.
local function key(name)
  return declared(base, name)
end

-- A build of feature f is over: f is served, and the next feature asked for is built (in the
-- order 'rws'), or the change ends.
local function built(f)
  served = with_feature(served, f)
  redis.call('HSET', fkey, 's', served)
  if has_feature(target, 'w') and not has_feature(served, 'w') then
    redis.call('HSET', fkey, 'b', 'w', 'c', '\1', 'n', '0')
  elseif has_feature(target, 's') and not has_feature(served, 's') then
    redis.call('HSET', fkey, 'b', 's', 'c', '', 'n', '0')
  else
    redis.call('HDEL', fkey, 'b', 'c')
    settle()
  end
end

-- The next first byte after the cursor's (its lex set walked), as a cursor; nil after the last.
local function next_first_byte(c)
  local b = string.byte(c, 1) + 1
  if b == 128 then
    b = 194
  end
  return b <= 244 and string.char(b) or nil
end

if op == 'drop-r' then
  if not has_feature(dropping, 'r') then
    return { 0 }
  end
  local names = {}
  for i = 5, #ARGV do
    names[#names + 1] = ARGV[i]
    key(ARGV[i])
  end
  check_declared()
  for _, name in ipairs(names) do
    redis.call('UNLINK', base .. ':' .. name)
  end
  if #names > 0 then
    redis.call('HDEL', heavy_set, unpack(names))
  end
  local left = false
  for _, f in ipairs(redis.call('HKEYS', heavy_set)) do
    local k = string.sub(f, 1, 2)
    if k == 'b:' or k == 'r:' or k == 't:' then
      left = true
      break
    end
  end
  if not left then
    redis.call('UNLINK', top)
    redis.call('HDEL', heavy_set, '')
    dropped('r')
  end
  return { 1, elapsed() }
elseif op == 'drop-w' then
  if not has_feature(dropping, 'w') then
    return { 0 }
  end
  local k = tonumber(ARGV[5])
  local words = {}
  for i = 6, 5 + k do
    words[#words + 1] = ARGV[i]
    key('w:' .. ARGV[i])
  end
  for i = 6 + k, #ARGV do
    key('vg:' .. ARGV[i])
  end
  check_declared()
  for _, w in ipairs(words) do
    redis.call('UNLINK', base .. ':w:' .. w)
  end
  for i = 6 + k, #ARGV do
    redis.call('UNLINK', base .. ':vg:' .. ARGV[i])
  end
  if k > 0 then
    redis.call('ZREM', vocab, unpack(words))
  end
  if redis.call('ZCARD', vocab) == 0 then
    dropping = string.gsub(dropping, 's', '')
    dropped('w')
  end
  return { 1, elapsed() }
elseif op == 'drop-s' then
  if not has_feature(dropping, 's') or has_feature(dropping, 'w') or ARGV[5] ~= drop_cursor then
    return { 0 }
  end
  for i = 7, #ARGV do
    key('vg:' .. ARGV[i])
  end
  check_declared()
  for i = 7, #ARGV do
    redis.call('UNLINK', base .. ':vg:' .. ARGV[i])
  end
  if ARGV[6] == '' then
    dropped('s')
  else
    redis.call('HSET', fkey, 'dc', ARGV[6])
  end
  return { 1, elapsed() }
elseif op == 'build-w' or op == 'build-s' then
  local f = op == 'build-w' and 'w' or 's'
  if building ~= f or ARGV[5] ~= cursor then
    return { 0 }
  end
  local k = tonumber(ARGV[6])
  -- The range Baton read: the first k items after the cursor, in the cursor's lex set (terms)
  -- or in the vocabulary (words).
  local set = f == 'w' and key(lex_name(cursor)) or vocab
  local now = redis.call('ZRANGE', set, cursor == '' and '-' or '(' .. cursor, '+', 'BYLEX',
    'LIMIT', 0, math.max(k, 1))
  local items, at = {}, 7
  for i = 1, k do
    items[i] = { ARGV[at], {} }
    local n = tonumber(ARGV[at + 1])
    for j = at + 2, at + 1 + n do
      local list = items[i][2]
      list[#list + 1] = ARGV[j]
      key((f == 'w' and 'w:' or 'vg:') .. ARGV[j])
    end
    at = at + 2 + n
  end
  if #now ~= k then
    return { 0 }
  end
  for i = 1, k do
    if now[i] ~= items[i][1] then
      return { 0 }
    end
  end
  check_declared()
  if k == 0 then
    if f == 's' then
      -- Every word is indexed: SUBSTRING is served from now on.
      built('s')
      return { 1, elapsed() }
    end
    -- No term left after the cursor in its lex set: on to the next first byte, or done.
    local next_cursor = next_first_byte(cursor)
    if next_cursor then
      redis.call('HSET', fkey, 'c', next_cursor)
    else
      built('w')
    end
    return { 1, elapsed() }
  end
  if f == 'w' then
    local words = {}
    for i = 1, k do
      for _, w in ipairs(items[i][2]) do
        redis.call('ZADD', base .. ':w:' .. w, 0, items[i][1])
        words[#words + 1] = '0'
        words[#words + 1] = w
      end
    end
    batched('ZADD', vocab, words, 2)
  else
    for i = 1, k do
      for _, g in ipairs(items[i][2]) do
        redis.call('SADD', base .. ':vg:' .. g, items[i][1])
      end
    end
  end
  redis.call('HSET', fkey, 'c', items[k][1], 'n', indexed + k)
  return { 1, elapsed() }
elseif op == 'build-r' then
  local heavy, max_depth, top_size, deep_size = tonumber(ARGV[5]), tonumber(ARGV[6]),
    tonumber(ARGV[7]), tonumber(ARGV[8])
  if building ~= 'r' or ARGV[9] ~= cursor then
    return { 0 }
  end
  local room, wide, k = tonumber(ARGV[10]), ARGV[11] == '1', tonumber(ARGV[12])
  -- The range Baton read: the first k terms after the cursor in the cursor's lex set.
  local lex = key(lex_name(cursor))
  local now = redis.call('ZRANGE', lex, '(' .. cursor, '+', 'BYLEX', 'LIMIT', 0, math.max(k, 1))
  work = work + #now
  if #now ~= k then
    return { 0 }
  end
  for i = 1, k do
    if now[i] ~= ARGV[12 + i] then
      return { 0 }
    end
  end
  if k == 0 then
    -- No term left after the cursor in its lex set: on to the next first byte, or done: the
    -- ranked sets hold the whole dictionary, RANKED is served.
    check_declared()
    local next_cursor = next_first_byte(cursor)
    if next_cursor then
      redis.call('HSET', fkey, 'c', next_cursor)
    else
      built('r')
    end
    return { 1, elapsed(), work, 0 }
  end
  local ranked = ranked_writer({ base = base, data = data, heavy_set = heavy_set, top = top,
    heavy = heavy, max_depth = max_depth, top_size = top_size, deep_size = deep_size,
    wide = wide, room = room, single = k == 1, limit = cursor, copy_limit = now[k],
    new_lex = {} })
  local ids = {}
  for i = 1, k do
    ids[i] = id_of(now[i])
  end
  local values = hash_values(data, ids)
  for i = 1, k do
    local m = now[i]
    ranked.term(string.sub(m, 1, string.find(m, '\0', 1, true) - 1), m,
      (parse_value(values[ids[i]])), nil, i)
  end
  local fields = { '' }
  ranked.fields(fields)
  local has = hash_values(heavy_set, fields)
  local refused, fits = ranked.plan(has, indexed + k)
  if refused then
    return { refused == 2 and 4 or 3, fits }
  end
  check_declared()
  local mark, marks = marker(has)
  ranked.apply(mark)
  if #marks > 0 then
    batched('HSET', heavy_set, marks, 2)
  end
  redis.call('HSET', fkey, 'c', now[k], 'n', indexed + k)
  return { 1, elapsed(), work, k }
end
return redis.error_reply('unknown step ' .. op)
