-- Remove: one step of a batch of dictionary terms to delete from every index: a few terms,
-- applied atomically, one command per key (as add.lua, which says how a batch is cut into
-- steps). Unknown terms are skipped. When the last term goes, no key of the dictionary is left.
-- Sizes are read before anything is removed (write.lua says why).
--
-- KEYS[1] data   KEYS[2] vocab   KEYS[3] heavy   KEYS[4] top   KEYS[5] features (as in add.lua:
--         only the indexes of the dictionary's features are touched; while RANKED is built, the
--         ranked sets of the terms at or before the build's cursor only, and their count `n`)
-- KEYS[..] every other key the step may touch (as in add.lua: the terms' lex sets, words, grams
--          of words, ranked and deep sets, and with ARGV[4] every first-byte ranked set)
-- ARGV[1] base (as in add.lua)
-- ARGV[2] low: a prefix's ranked or deep set is dropped once the prefix has this many terms or
--         fewer;
--         the first-byte ranked sets and the top set all go once the dictionary has this many
--         terms or fewer
-- ARGV[3] max depth (as in add.lua)
-- ARGV[4] '1' when every lex set and first-byte ranked set is declared, else ''
-- ARGV[5] the features Baton planned the step for (as add.lua's ARGV[12])
-- ARGV[6..] per term: id, key, word count, the words
--
-- Returns {0, removed, term count, work done (units as in add.lua's ARGV[11]), its Redis time in
-- microseconds (elapsed), the features a write needs and '+' while a change of them is under way
-- (write_told)}; {2} (nothing removed)
-- when the step would leave the dictionary with `low` terms or fewer while it is ranked: send it
-- again with every first-byte set declared; {6, features} (nothing removed, write_told) when the
-- step needs the keys of features ARGV[5] lacks: plan it for these.
local data, vocab, heavy_set, top = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local base, low, max_depth, wide = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1'
local fstate = write_state(KEYS[5])
-- While RANKED is built, the ranked sets hold only the terms at or before the build's cursor,
-- and their thresholds count only those (ranking.lua): a term after it is in no ranked set.
local building_r = fstate.building == 'r' and not has_feature(fstate.served, 'r')
local limit = building_r and fstate.cursor or nil
local needs, told = write_needs(fstate), write_told(fstate)
if missing_feature(ARGV[5], needs) then
  return { 6, told }
end
-- Gram sets lose the words that leave the vocabulary also while they are being deleted, so that
-- the deletion, which walks the vocabulary, finds every one.
local function grams_on(word)
  return maintains(fstate, 's', word) or has_feature(fstate.dropping, 's')
end

-- The terms, each once, and the values of those there are.
local terms, seen, ids = {}, {}, {}
local at = 6
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
  work = work + last - first + 1
  for i = first, last do
    old[i] = got[i - first + 1]
  end
end

-- What to remove, grouped by key.
local gone_ids, lex_order, lex_members, word_order, word_members = {}, {}, {}, {}, {}
local levels, groups, gone_ranked, deeps, deep_order = {}, {}, {}, {}, {}
-- Terms leaving the ranked sets' dictionary.
local gone_r = 0
for i, at in ipairs(terms) do
  if old[i] then
    local id, key = ids[i], ARGV[at + 1]
    local member = key .. '\0' .. id
    gone_ids[#gone_ids + 1] = id
    group(lex_members, lex_order, lex_name(key), member)
    for w = at + 3, maintains(fstate, 'w', member) and at + 2 + tonumber(ARGV[at + 2]) or 0 do
      group(word_members, word_order, ARGV[w], member)
    end
    local ranked_on = maintains(fstate, 'r', member)
    local ranked = rank_bytes((parse_value(old[i]))) .. member
    if ranked_on then
      gone_ranked[#gone_ranked + 1] = ranked
      gone_r = gone_r + 1
    end
    local list = ranked_on and ranked_prefixes(key, max_depth) or {}
    for l = 1, #list do
      local g = groups[list[l]]
      if g == nil then
        g = { name = set_name(list[l]), members = {} }
        g.key = declared(base, g.name)
        groups[list[l]] = g
        levels[l] = levels[l] or {}
        levels[l][#levels[l] + 1] = g
      end
      g.members[#g.members + 1] = ranked
    end
    local p = ranked_on and first_chars(key, max_depth + 1)
    if p then
      local d = deeps[p]
      if d == nil then
        d = { prefix = p, name = 't:' .. p, members = {} }
        d.key = declared(base, d.name)
        deeps[p] = d
        deep_order[#deep_order + 1] = d
      end
      d.members[#d.members + 1] = ranked
    end
  end
end
if #gone_ids == 0 then
  return { 0, 0, redis.call('HLEN', data), work, elapsed(), told }
end
local lex_keys, word_keys = {}, {}
for _, name in ipairs(lex_order) do
  lex_keys[name] = declared(base, name)
end
for _, word in ipairs(word_order) do
  word_keys[word] = declared(base, 'w:' .. word)
end

-- Sizes before anything goes: which sets this step empties or shrinks past `low`.
local count = redis.call('HLEN', data) - #gone_ids
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
-- The size of the ranked sets' dictionary once the step's terms are gone.
local ranked_count = building_r and fstate.indexed - gone_r or count
local unranks = gone_r > 0 and has[''] and ranked_count <= low
if unranks and not wide then
  return { 2 }
end
for l, level in ipairs(levels) do
  for _, g in ipairs(level) do
    if has[g.name] then
      g.size = redis.call('ZCARD', g.key)
    end
  end
end
for _, d in ipairs(deep_order) do
  if has[d.name] then
    local p = d.prefix
    local lex = lex_keys[lex_name(p)]
    local hi = p .. '\255'
    hi = (limit and lt(limit, hi)) and '[' .. limit or '(' .. hi
    d.left = redis.call('ZLEXCOUNT', lex, '[' .. p, hi) - #d.members
    work = work + 1
  end
end
local last_top = gone_r > 0 and has[''] and not unranks and redis.call('ZRANGE', top, -1, -1)[1]
local first_byte_sets
if unranks then
  local _, names = all_first_byte_names()
  local exists = redis.call('HMGET', heavy_set, unpack(names))
  work = work + #names
  first_byte_sets = {}
  for i, name in ipairs(names) do
    if exists[i] then
      first_byte_sets[#first_byte_sets + 1] = name
      declared(base, name)
    end
  end
end
local gram_keys = {}
for _, word in ipairs(word_order) do
  for _, gram in ipairs(grams_on(word) and grams_of(utf8_chars(word)) or {}) do
    gram_keys[gram] = gram_keys[gram] or declared(base, 'vg:' .. gram)
  end
end
check_declared()

-- Writes.
local unmark, gone = {}, {}
batched('HDEL', data, gone_ids)
for _, name in ipairs(lex_order) do
  local lk = lex_keys[name]
  local size = redis.call('ZCARD', lk)
  if batched('ZREM', lk, lex_members[name]) == size then
    unmark[#unmark + 1] = name
  end
end

-- Words no term has any more leave the vocabulary and their grams' sets.
local gone_words, gram_order, gram_words = {}, {}, {}
for _, word in ipairs(word_order) do
  local wk = word_keys[word]
  local size = redis.call('ZCARD', wk)
  if batched('ZREM', wk, word_members[word]) == size then
    gone_words[#gone_words + 1] = word
    local grams = grams_on(word) and grams_of(utf8_chars(word)) or {}
    for g = 1, #grams do
      group(gram_words, gram_order, grams[g], word)
    end
  end
end
if #gone_words > 0 then
  batched('ZREM', vocab, gone_words)
  for _, gram in ipairs(gram_order) do
    gram_batched('SREM', gram_keys[gram], gram_words[gram])
  end
end

-- Ranked sets: out of every set of the terms' prefixes; a prefix's set goes once it has `low`
-- terms or fewer, a first byte's once it is empty.
for l, level in ipairs(levels) do
  for _, g in ipairs(level) do
    if g.size then
      local left = g.size - batched('ZREM', g.key, g.members)
      if left == 0 then
        unmark[#unmark + 1] = g.name
        gone[g.name] = true
      elseif l > 1 and left <= low then
        redis.call('UNLINK', g.key)
        work = work + 1
        unmark[#unmark + 1] = g.name
        gone[g.name] = true
      end
    end
  end
end
-- Deep sets: out of them the terms ranked at or before their bound; gone once their prefix has
-- `low` terms or fewer.
for _, d in ipairs(deep_order) do
  if d.left then
    if d.left <= low then
      -- (UNLINK: Redis frees a large set off its main thread.)
      redis.call('UNLINK', d.key)
      work = work + 1
      unmark[#unmark + 1] = d.name
    else
      local bound = has[d.name]
      local leaves = {}
      for _, r in ipairs(d.members) do
        if not lt(bound, r) then
          leaves[#leaves + 1] = r
        end
      end
      if #leaves > 0 then
        batched('ZREM', d.key, leaves)
      end
    end
  end
end
if last_top then
  -- Out of the top set (add.lua): the terms ranked at or before its last member.
  local leaves = {}
  for _, ranked in ipairs(gone_ranked) do
    if not lt(last_top, ranked) then
      leaves[#leaves + 1] = ranked
    end
  end
  if #leaves > 0 then
    batched('ZREM', top, leaves)
  end
elseif unranks then
  -- Few terms left: no more first-byte ranked sets nor top set (the other ranked sets go as
  -- their prefixes shrink).
  redis.call('UNLINK', top)
  work = work + 1
  unmark[#unmark + 1] = ''
  for _, name in ipairs(first_byte_sets) do
    if not gone[name] then
      redis.call('UNLINK', base .. ':' .. name)
      work = work + 1
      unmark[#unmark + 1] = name
    end
  end
end
if #unmark > 0 then
  batched('HDEL', heavy_set, unmark)
end
if building_r and gone_r > 0 then
  redis.call('HSET', KEYS[5], 'n', ranked_count)
end
return { 0, #gone_ids, count, work, elapsed(), told }
