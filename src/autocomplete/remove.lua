-- Remove: delete a batch of dictionary terms from every index, atomically, one command per key
-- (as add.lua). Unknown terms are skipped. When the last term goes, no key of the dictionary is
-- left.
--
-- KEYS[1] data   KEYS[2] vocab   KEYS[3] heavy   (as in add.lua)
-- ARGV[1] base (as in add.lua)
-- ARGV[2] low: a prefix's ranked or deep set is dropped once the prefix has this many terms or
--         fewer;
--         the first-byte ranked sets and the top set all go once the dictionary has this many
--         terms or fewer
-- ARGV[3] max depth (as in add.lua)
-- ARGV[4..] per term: id, key, word count, the words
--
-- Returns {removed, term count}.
local data, vocab, heavy_set = KEYS[1], KEYS[2], KEYS[3]
local base, low, max_depth = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

-- The terms, each once, and the values of those there are.
local terms, seen, ids = {}, {}, {}
local at = 4
while at <= #ARGV do
  local id = ARGV[at]
  if not seen[id] then
    seen[id] = true
    terms[#terms + 1] = at
    ids[#ids + 1] = id
  end
  at = at + 3 + tonumber(ARGV[at + 2])
end
local old = {}
for first = 1, #ids, CHUNK do
  local last = math.min(first + CHUNK - 1, #ids)
  local got = redis.call('HMGET', data, unpack(ids, first, last))
  for i = first, last do
    old[i] = got[i - first + 1]
  end
end

-- What to remove, grouped by key.
local gone_ids, lex_order, lex_members, word_order, word_members = {}, {}, {}, {}, {}
local levels, groups, gone_ranked, deeps, deep_order = {}, {}, {}, {}, {}
for i, at in ipairs(terms) do
  if old[i] then
    local id, key = ids[i], ARGV[at + 1]
    local member = key .. '\0' .. id
    gone_ids[#gone_ids + 1] = id
    group(lex_members, lex_order, lex_name(key), member)
    for w = at + 3, at + 2 + tonumber(ARGV[at + 2]) do
      group(word_members, word_order, ARGV[w], member)
    end
    local ranked = rank_bytes((parse_value(old[i]))) .. member
    gone_ranked[#gone_ranked + 1] = ranked
    local list = ranked_prefixes(key, max_depth)
    for l = 1, #list do
      local g = groups[list[l]]
      if g == nil then
        g = { name = set_name(list[l]), members = {} }
        groups[list[l]] = g
        levels[l] = levels[l] or {}
        levels[l][#levels[l] + 1] = g
      end
      g.members[#g.members + 1] = ranked
    end
    local p = first_chars(key, max_depth + 1)
    if p then
      local d = deeps[p]
      if d == nil then
        d = { prefix = p, name = 't:' .. p, members = {} }
        deeps[p] = d
        deep_order[#deep_order + 1] = d
      end
      d.members[#d.members + 1] = ranked
    end
  end
end
if #gone_ids == 0 then
  return { 0, redis.call('HLEN', data) }
end
local unmark = {}
batched('HDEL', data, gone_ids)
for _, name in ipairs(lex_order) do
  local lk = base .. ':' .. name
  batched('ZREM', lk, lex_members[name])
  if redis.call('EXISTS', lk) == 0 then
    unmark[#unmark + 1] = name
  end
end

-- Words no term has any more leave the vocabulary and their grams' sets.
local gone_words, gram_order, gram_words = {}, {}, {}
for _, word in ipairs(word_order) do
  local wk = base .. ':w:' .. word
  batched('ZREM', wk, word_members[word])
  if redis.call('EXISTS', wk) == 0 then
    gone_words[#gone_words + 1] = word
    local grams = grams_of(utf8_chars(word))
    for g = 1, #grams do
      group(gram_words, gram_order, grams[g], word)
    end
  end
end
if #gone_words > 0 then
  batched('ZREM', vocab, gone_words)
  for _, gram in ipairs(gram_order) do
    batched('SREM', base .. ':vg:' .. gram, gram_words[gram])
  end
end

-- Ranked sets: out of every set of the terms' prefixes; a prefix's set goes once it has `low`
-- terms or fewer, a first byte's once it is empty.
local fields = { '' }
for _, level in ipairs(levels) do
  for _, g in ipairs(level) do
    fields[#fields + 1] = g.name
  end
end
for _, d in ipairs(deep_order) do
  fields[#fields + 1] = d.name
end
local has = hash_values(heavy_set, fields)
for l, level in ipairs(levels) do
  for _, g in ipairs(level) do
    if has[g.name] then
      local rk = base .. ':' .. g.name
      batched('ZREM', rk, g.members)
      local size = redis.call('ZCARD', rk)
      if size == 0 or (l > 1 and size <= low) then
        redis.call('DEL', rk)
        unmark[#unmark + 1] = g.name
      end
    end
  end
end
-- Deep sets: out of them the terms ranked at or before their bound; gone once their prefix has
-- `low` terms or fewer.
for _, d in ipairs(deep_order) do
  local bound = has[d.name]
  if bound then
    local key = base .. ':' .. d.name
    local leaves = {}
    for _, r in ipairs(d.members) do
      if not lt(bound, r) then
        leaves[#leaves + 1] = r
      end
    end
    if #leaves > 0 then
      batched('ZREM', key, leaves)
    end
    local p = d.prefix
    local lex = base .. ':' .. lex_name(p)
    if redis.call('ZLEXCOUNT', lex, '[' .. p, '(' .. p .. '\255') <= low then
      redis.call('DEL', key)
      unmark[#unmark + 1] = d.name
    end
  end
end
local count = redis.call('HLEN', data)
local top = base .. ':top'
if has[''] and count > low then
  -- Out of the top set (add.lua): the terms ranked at or before its last member.
  local last = redis.call('ZRANGE', top, -1, -1)[1]
  local leaves = {}
  for _, ranked in ipairs(gone_ranked) do
    if last and not lt(last, ranked) then
      leaves[#leaves + 1] = ranked
    end
  end
  if #leaves > 0 then
    batched('ZREM', top, leaves)
  end
elseif has[''] then
  -- Few terms left: no more first-byte ranked sets nor top set (the other ranked sets go as
  -- their prefixes shrink).
  redis.call('DEL', top)
  unmark[#unmark + 1] = ''
  local names = {}
  for b = 1, 244 do
    if b < 128 or b >= 194 then
      names[#names + 1] = set_name(string.char(b))
    end
  end
  local exists = redis.call('HMGET', heavy_set, unpack(names))
  for i, name in ipairs(names) do
    if exists[i] then
      redis.call('DEL', base .. ':' .. name)
      unmark[#unmark + 1] = name
    end
  end
end
if #unmark > 0 then
  batched('HDEL', heavy_set, unmark)
end
return { #gone_ids, count }
