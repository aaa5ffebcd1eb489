-- Add: insert or update a batch of dictionary terms, atomically. Every entry is checked before
-- anything is written, so a rejected batch changes nothing. The work of the batch is grouped by
-- key: one command per key (in chunks of CHUNK arguments), however many entries touch it.
--
-- KEYS[1] data   hash: id -> "<score>\0<display, '' when equal to id>\0<payload>"; its length
--                is the number of terms
-- KEYS[2] vocab  sorted set, every score 0: every word of every term
-- KEYS[3] heavy  hash: set name -> 1 for every lex set (lex_name) and ranked set (set_name)
--                there is, or its bound for a deep set ('t:' .. prefix); '' -> 1 while the
--                first-byte ranked sets exist (the dictionary is ranked)
-- ARGV[1] base: the dictionary's other keys, which share the hash tag of KEYS, are
--         <base>:l:<hex>     sorted set, every score 0: the lex members "<key>\0<id>" of the
--                            terms whose matching form starts with that byte
--         <base>:b:<hex>     ranked set of the terms whose matching form starts with that byte,
--                            kept while the dictionary is ranked (it has had more than `heavy`
--                            terms, and has not fallen to half of that since)
--         <base>:r:<prefix>  ranked set of every term starting with that prefix of 1 to
--                            `max depth` characters (not a byte: see ranked_prefixes), kept while
--                            the prefix has more than `heavy` terms (remove.lua says when it goes)
--         <base>:t:<prefix>  ranked set of the best-ranked terms starting with that prefix of
--                            `max depth` + 1 characters: every term of the prefix ranked at or
--                            before its bound (the field's value in the heavy hash, '\255' for
--                            all); cut back to `deep` members when it passes twice that; kept
--                            while the prefix has more than `heavy` terms, created past it
--         <base>:top         ranked set of the best-ranked terms of a ranked dictionary: every
--                            term ranked at or before its last member (so walks by score
--                            of the whole dictionary start with one set); cut back to `top`
--                            members when it passes twice that
--         <base>:w:<word>    lex members of the terms having that word
--         <base>:vg:<gram>   set of the vocabulary words containing that gram
-- ARGV[2] heavy: a prefix (or the dictionary) gets ranked sets once it has more terms than this
-- ARGV[3] largest absolute score allowed
-- ARGV[4] max depth: only prefixes of at most this many characters get a ranked set
-- ARGV[5] top: the size the top set is cut back to
-- ARGV[6] deep: the size a deep set is cut back to
-- ARGV[7..] per entry: id, key, display ('' when equal to id), score op ('' keep, 's' set,
--           'i' add), score, payload ('' keep, or 'p' .. payload), word count, the words.
--           Entries of one term come in the order they were sent.
--
-- Returns {0, added, updated, term count, score of each entry (as text)...}, or {1, entry number}
-- when an entry's resulting score would be out of range.
local argv, call = ARGV, redis.call
local data, vocab, heavy_set = KEYS[1], KEYS[2], KEYS[3]
local base, heavy, max_score = argv[1], tonumber(argv[2]), tonumber(argv[3])
local max_depth, top_size, deep_size = tonumber(argv[4]), tonumber(argv[5]), tonumber(argv[6])
local top = base .. ':top'

-- The entries (their first argument's index); terms: one state per distinct id, in order of
-- first entry.
local entries, terms, state = {}, {}, {}
local at = 7
while at <= #argv do
  entries[#entries + 1] = at
  local id = argv[at]
  if state[id] == nil then
    state[id] = { at = at }
    terms[#terms + 1] = id
  end
  at = at + 7 + tonumber(argv[at + 6])
end

-- Pass 1: the value every term ends with, and the score after each entry; reject the whole batch
-- on one out of range. An entry adds a term unless the term was there before it. Scores keep
-- the text they came in (Baton's, which reads back exactly) unless added to here.
local old = hash_values(data, terms)
for _, id in ipairs(terms) do
  local t = state[id]
  local v = old[id]
  if v then
    local a = find(v, '\0', 1, true)
    local b = find(v, '\0', a + 1, true)
    t.old, t.there = v, true
    t.text = sub(v, 1, a - 1)
    t.old_score = tonumber(t.text)
    t.score, t.payload = t.old_score, sub(v, b + 1)
  else
    t.score, t.text, t.payload = 0, '0', ''
  end
end
local scores, added, updated = {}, 0, 0
for i, at in ipairs(entries) do
  local t = state[argv[at]]
  if t.there then
    updated = updated + 1
  else
    added = added + 1
    t.there = true
  end
  local op, score, text = argv[at + 3], t.score, t.text
  if op == 's' then
    score, text = tonumber(argv[at + 4]), argv[at + 4]
  elseif op == 'i' then
    score, text = score + tonumber(argv[at + 4]), nil
  end
  if not (score >= -max_score and score <= max_score) then
    return { 1, i }
  end
  if score == 0 then
    score, text = 0, '0' -- not -0
  end
  t.score, t.text = score, text or score_text(score)
  t.display = argv[at + 2]
  if argv[at + 5] ~= '' then
    t.payload = sub(argv[at + 5], 2)
  end
  scores[i] = t.text
end

-- What to write, grouped by key: the data of every term; lex members and words of the new ones;
-- the ranked members of the terms that enter ranked sets (new) or move in them (score changed),
-- by prefix, prefixes by depth (parents first).
local values, lex_order, lex_members = {}, {}, {}
local word_order, word_members = {}, {}
local levels, groups, moves, deeps, deep_order = {}, {}, {}, {}, {}
for _, id in ipairs(terms) do
  local t = state[id]
  values[#values + 1] = id
  values[#values + 1] = t.text .. '\0' .. t.display .. '\0' .. t.payload
  local key = argv[t.at + 1]
  local member = key .. '\0' .. id
  if not t.old then
    local lex = lex_name(key)
    group(lex_members, lex_order, lex, '0')
    group(lex_members, lex_order, lex, member)
    local first = t.at + 7
    for w = first, first + tonumber(argv[t.at + 6]) - 1 do
      group(word_members, word_order, argv[w], '0')
      group(word_members, word_order, argv[w], member)
    end
  end
  if not t.old or t.score ~= t.old_score then
    local new_ranked = rank_bytes(t.score) .. member
    local old_ranked = t.old and (rank_bytes(t.old_score) .. member)
    moves[#moves + 1] = { new_ranked, old_ranked }
    local list = ranked_prefixes(key, max_depth)
    for l = 1, #list do
      local p = list[l]
      local g = groups[p]
      if g == nil then
        g = { prefix = p, name = set_name(p), parent = list[l - 1], adds = {}, removes = {} }
        groups[p] = g
        levels[l] = levels[l] or {}
        levels[l][#levels[l] + 1] = g
      end
      g.adds[#g.adds + 1] = '0'
      g.adds[#g.adds + 1] = new_ranked
      if old_ranked then
        g.removes[#g.removes + 1] = old_ranked
      end
    end
    local p = first_chars(key, max_depth + 1)
    if p then
      local d = deeps[p]
      if d == nil then
        d = { prefix = p, name = 't:' .. p, parent = list[#list], adds = {}, removes = {} }
        deeps[p] = d
        deep_order[#deep_order + 1] = d
      end
      d.adds[#d.adds + 1] = new_ranked
      if old_ranked then
        d.removes[#d.removes + 1] = old_ranked
      end
    end
  end
end

-- Which of these sets exist.
local fields = { '' }
for _, name in ipairs(lex_order) do
  fields[#fields + 1] = name
end
for _, level in ipairs(levels) do
  for _, g in ipairs(level) do
    fields[#fields + 1] = g.name
  end
end
for _, d in ipairs(deep_order) do
  fields[#fields + 1] = d.name
end
local has = hash_values(heavy_set, fields)
local marks = {}
local function mark(name)
  if not has[name] then
    has[name] = '1'
    marks[#marks + 1] = name
    marks[#marks + 1] = '1'
  end
end

batched('HSET', data, values, 2)
for _, name in ipairs(lex_order) do
  batched('ZADD', base .. ':' .. name, lex_members[name], 2)
  mark(name)
end

-- Words: each posting once; new words into the vocabulary and the sets of their grams.
if #word_order > 0 then
  local new_words, gram_order, gram_words = {}, {}, {}
  for first = 1, #word_order, CHUNK do
    local last = math.min(first + CHUNK - 1, #word_order)
    local known = call('ZMSCORE', vocab, unpack(word_order, first, last))
    for i = first, last do
      if not known[i - first + 1] then
        local word = word_order[i]
        new_words[#new_words + 1] = '0'
        new_words[#new_words + 1] = word
        local grams = grams_of(utf8_chars(word))
        for g = 1, #grams do
          group(gram_words, gram_order, grams[g], word)
        end
      end
    end
  end
  for _, word in ipairs(word_order) do
    batched('ZADD', base .. ':w:' .. word, word_members[word], 2)
  end
  if #new_words > 0 then
    batched('ZADD', vocab, new_words, 2)
    for _, gram in ipairs(gram_order) do
      batched('SADD', base .. ':vg:' .. gram, gram_words[gram], 1)
    end
  end
end

-- Ranked sets.
local count = call('HLEN', data)
if levels[1] then
  local created = {}

  -- Copies the lex members `members` into the ranked sets of their prefixes (prefix_of),
  -- creating them, with the scores just written; and into the top set when `and_top`.
  local function materialize(members, prefix_of, and_top)
    local ids = {}
    for i = 1, #members do
      ids[i] = id_of(members[i])
    end
    local value = hash_values(data, ids)
    local order, by_prefix = {}, {}
    for i = 1, #members do
      local ranked = rank_bytes((parse_value(value[ids[i]]))) .. members[i]
      group(by_prefix, order, prefix_of(members[i]), '0')
      group(by_prefix, order, prefix_of(members[i]), ranked)
    end
    for _, p in ipairs(order) do
      batched('ZADD', base .. ':' .. set_name(p), by_prefix[p], 2)
      created[p] = true
      mark(set_name(p))
      if and_top then
        batched('ZADD', top, by_prefix[p], 2)
      end
    end
  end

  local ranked_before = has['']
  if not has[''] and count > heavy then
    -- The dictionary just passed `heavy` terms (it has at most `heavy` + a batch): every term
    -- into the ranked set of its first byte, lex set by lex set, and into the top set.
    local names = all_lex_names()
    local exists = call('HMGET', heavy_set, unpack(names))
    for i, name in ipairs(names) do
      if exists[i] or has[name] then
        materialize(call('ZRANGE', base .. ':' .. name, 0, -1), function(m)
          return sub(m, 1, 1)
        end, true)
      end
    end
    mark('')
  end
  -- Deep sets: every term of their prefix ranked at or before their bound. One is created (with
  -- every term of its prefix, at most `heavy` + a batch) when its prefix passes `heavy` terms.
  for _, d in ipairs(deep_order) do
    local key = base .. ':' .. d.name
    local bound = has[d.name]
    if bound then
      local joins, leaves = {}, {}
      for _, r in ipairs(d.removes) do
        if not lt(bound, r) then
          leaves[#leaves + 1] = r
        end
      end
      for _, r in ipairs(d.adds) do
        if lt(r, bound) then
          joins[#joins + 1] = '0'
          joins[#joins + 1] = r
        end
      end
      if #leaves > 0 then
        batched('ZREM', key, leaves, 1)
      end
      if #joins > 0 then
        batched('ZADD', key, joins, 2)
      end
    elseif has[groups[d.parent].name] or created[d.parent] then
      local lex = base .. ':' .. lex_name(d.prefix)
      local p = d.prefix
      if call('ZLEXCOUNT', lex, '[' .. p, '(' .. p .. '\255') > heavy then
        local members = call('ZRANGE', lex, '[' .. p, '(' .. p .. '\255', 'BYLEX')
        local ids = {}
        for i = 1, #members do
          ids[i] = id_of(members[i])
        end
        local value = hash_values(data, ids)
        local ranked = {}
        for i = 1, #members do
          ranked[#ranked + 1] = '0'
          ranked[#ranked + 1] = rank_bytes((parse_value(value[ids[i]]))) .. members[i]
        end
        batched('ZADD', key, ranked, 2)
        bound = '\255'
        marks[#marks + 1] = d.name
        marks[#marks + 1] = bound
      end
    end
    if bound and call('ZCARD', key) > 2 * deep_size then
      local cut = call('ZRANGE', key, deep_size - 1, deep_size - 1)[1]
      call('ZREMRANGEBYLEX', key, '(' .. cut, '+')
      marks[#marks + 1] = d.name
      marks[#marks + 1] = cut
    end
  end

  if ranked_before then
    -- The top set holds every term ranked at or before its last member: a term joins it when
    -- ranked before that, leaves it when it goes or moves past it.
    local last = call('ZRANGE', top, -1, -1)[1]
    if last then
      local joins, leaves = {}, {}
      for _, move in ipairs(moves) do
        if move[2] and not lt(last, move[2]) then
          leaves[#leaves + 1] = move[2]
        end
        if lt(move[1], last) then
          joins[#joins + 1] = '0'
          joins[#joins + 1] = move[1]
        end
      end
      if #leaves > 0 then
        batched('ZREM', top, leaves, 1)
      end
      if #joins > 0 then
        batched('ZADD', top, joins, 2)
        if call('ZCARD', top) > 2 * top_size then
          local cut = call('ZRANGE', top, top_size - 1, top_size - 1)[1]
          call('ZREMRANGEBYLEX', top, '(' .. cut, '+')
        end
      end
    end
  end
  for l, level in ipairs(levels) do
    for _, g in ipairs(level) do
      local p = g.prefix
      if created[p] then
        -- Copied whole.
      elseif has[g.name] or (l == 1 and has['']) then
        -- (A first byte without a set while the dictionary is ranked: only new terms have it.)
        if #g.removes > 0 then
          batched('ZREM', base .. ':' .. g.name, g.removes, 1)
        end
        batched('ZADD', base .. ':' .. g.name, g.adds, 2)
        mark(g.name)
      elseif l > 1 and (has[groups[g.parent].name] or created[g.parent]) then
        -- Without a set, the prefix had at most `heavy` terms (its parent has a set, else the
        -- parent had at most `heavy` terms and so had the prefix): it may have just passed it.
        local lex = base .. ':' .. lex_name(p)
        if call('ZLEXCOUNT', lex, '[' .. p, '(' .. p .. '\255') > heavy then
          materialize(call('ZRANGE', lex, '[' .. p, '(' .. p .. '\255', 'BYLEX'), function()
            return p
          end)
        end
      end
    end
  end
end
if #marks > 0 then
  batched('HSET', heavy_set, marks, 2)
end

local reply = { 0, added, updated, count }
for i = 1, #scores do
  reply[#reply + 1] = scores[i]
end
return reply
