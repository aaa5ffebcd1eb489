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
--   'drop-r', names...: delete these ranked sets (fields of heavy), and the top set once none is
--        left
--   'drop-w', k, words (k), grams...: delete the postings of these first k vocabulary words and
--        the words, and these gram sets (when SUBSTRING goes too)
--   'drop-s', cursor, last, grams...: delete these gram sets, of the vocabulary words after the
--        cursor up to last ('' when no word is left)
--   'build-w', cursor, k, then per term: lex member, word count, words: index these k terms,
--        the first after the cursor in the cursor's lex set (k = 0: none is left there)
--   'build-s', cursor, k, then per word: word, gram count, grams: index these k vocabulary
--        words, the first after the cursor
--
-- Returns {1} when the step was applied, {0} when the state or the range changed since Baton
-- read them (nothing changed), {-2} when another driver holds the lease, {2} when no change is
-- under way (the lease is released).
local data, vocab, heavy_set, top, fkey, lease = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local base, owner, ttl, op = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- The lease is taken by the first step of a driver when no other holds it, and renewed by each.
local holder = redis.call('GET', lease)
if holder and holder ~= owner then
  return { -2 }
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
  return { 1 }
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
  return { 1 }
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
  return { 1 }
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
      redis.call('HSET', fkey, 's', served .. 's')
      redis.call('HDEL', fkey, 'b', 'c')
      settle()
      return { 1 }
    end
    -- No term left after the cursor in its lex set: on to the next first byte, or done.
    local b = string.byte(cursor, 1) + 1
    if b == 128 then
      b = 194
    end
    if b <= 244 then
      redis.call('HSET', fkey, 'c', string.char(b))
      return { 1 }
    end
    local now_served = ''
    for _, x in ipairs({ 'r', 'w', 's' }) do
      if has_feature(served, x) or x == 'w' then
        now_served = now_served .. x
      end
    end
    redis.call('HSET', fkey, 's', now_served)
    if has_feature(target, 's') and not has_feature(now_served, 's') then
      redis.call('HSET', fkey, 'b', 's', 'c', '', 'n', '0')
    else
      redis.call('HDEL', fkey, 'b', 'c')
      settle()
    end
    return { 1 }
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
  return { 1 }
end
return redis.error_reply('unknown step ' .. op)
