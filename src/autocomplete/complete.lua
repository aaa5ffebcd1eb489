-- Complete: one page of a dictionary's terms matching a query. Reads only (flags=no-writes).
--
-- KEYS[1] the lex set of the query's first byte   KEYS[2] data   KEYS[3] vocab   KEYS[4] heavy
--         (the features hash, <base>:f, is derived like the sets: see ranked.lua)
-- ARGV[1] base (as in add.lua: <base>:l:<hex>, <base>:b:<hex>, <base>:r:<prefix>,
--         <base>:w:<word>, <base>:vg:<gram>)
-- ARGV[2] mode: 'prefix' | 'word' | 'suffix' | 'contains' | 'auto'
-- ARGV[3] order: 'lex' | 'score'
-- ARGV[4] limit
-- ARGV[5] the normalized query
-- ARGV[6] auto mode: the group the page starts in (EXACT, PREFIX, WORD or CONTAINS)
-- ARGV[7] where the previous page stopped, exclusive: '' for the start of the group, else a lex
--         member (lex order) or a ranked member (score order)
-- ARGV[8] the non-ASCII word separators
-- ARGV[9] gather: a candidate set this small is read whole and put in order here
-- ARGV[10] budget: the most index entries this call may look at
-- ARGV[11] max depth: the longest prefix (in characters) that can have a ranked set
-- ARGV[12] 's' when the query starts with a separator, 'e' when it ends with one (or both)
-- ARGV[13] heavy: prefixes of at most `max depth` characters with more terms have a ranked set,
--          and so have the first bytes of a dictionary with more terms
-- ARGV[14] the features the query needs (letters of features.lua)
-- ARGV[15..] the query's words (runs of non-separators), in order
--
-- Returns {next group, next position, then per result: id, data value, match kind}; the next
-- group is 0 when there are no more results. Returns {-1, letter, progress} when the dictionary lacks
-- the feature `letter` the query needs (features.lua).
--
-- Where results come from, all read in the result order from the position on, so that a page
-- never depends on an offset:
-- - prefix, lexicographic: the range of the prefix in the lex set of its first byte;
-- - prefix, by score: the prefix's ranked set, or, for a prefix with at most `heavy` terms
--   (add.lua), that range of the lex set ranked here, or the ranked set of its longest prefix
--   that has one, checking each term;
-- - word prefix, suffix, contains: the terms having one vocabulary word (the query's rarest
--   whole word, the words starting with it, or the words containing its longest fragment), one
--   posting walked in order or several merged here when they hold at most `gather` terms;
--   otherwise the query is common and the whole dictionary is walked checking each term: the
--   lex sets one after the other, or, by score, the first-byte ranked sets merged.
-- No call looks at more than about `budget` entries; a page cut short by the budget carries a
-- position to go on from.
local lex, data, vocab, heavy_set = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
do
  local missing = missing_feature(features_of(ARGV[1] .. ':f'), ARGV[14])
  if missing then
    return refusal(ARGV[1] .. ':f', missing)
  end
end
local base, mode, order = ARGV[1], ARGV[2], ARGV[3]
local need = tonumber(ARGV[4])
Q = ARGV[5]
local group, pos = tonumber(ARGV[6]), ARGV[7]
SEPS = ARGV[8]
local gather, budget = tonumber(ARGV[9]), tonumber(ARGV[10])
local max_depth = tonumber(ARGV[11])
local heavy = tonumber(ARGV[13])
local starts_sep = string.find(ARGV[12], 's', 1, true) ~= nil
local ends_sep = string.find(ARGV[12], 'e', 1, true) ~= nil
local tokens = {}
for i = 15, #ARGV do
  tokens[#tokens + 1] = ARGV[i]
end
-- The most vocabulary words whose postings one call gathers, and merges in lex order.
local WORD_CAP, MERGE_CAP = 256, 32

local out, kinds = {}, {} -- lex members of the results, and how they matched

local function from(lo)
  return pos ~= '' and '(' .. pos or lo
end

-- Walks src (ranked members when `ranked`) in order from lo to hi, keeping the entries `want`
-- accepts. Returns done (the source ran out), and when not done the position to go on from.
local function walk(src, lo, hi, ranked, want)
  local s = ranked and 9 or 1
  local cur, last = lo, nil
  local grow = need - #out + 1
  while budget > 0 do
    local chunk = math.min(budget, grow)
    grow = math.min(math.max(grow * 2, 64), 1024)
    local batch = redis.call('ZRANGE', src, cur, hi, 'BYLEX', 'LIMIT', 0, chunk)
    budget = budget - #batch
    for i = 1, #batch do
      local m = batch[i]
      last = m
      local kind = accept(want, m, s)
      if kind > 0 then
        out[#out + 1] = ranked and string.sub(m, 9) or m
        kinds[#kinds + 1] = kind
        if #out >= need then
          if i == #batch and #batch < chunk then
            return true
          end
          return false, m
        end
      end
    end
    if #batch < chunk then
      return true
    end
    cur = '(' .. last
  end
  return false, last or pos
end

-- Puts candidates {lex member, kind, score} in the result order and takes those after the
-- position, up to the page's room. Returns done and the position to go on from.
local function take_page(cands)
  local room = need - #out
  local ps, pm
  if pos ~= '' and order == 'score' then
    ps, pm = rank_score(pos), string.sub(pos, 9)
  end
  local function before(a, b)
    if order == 'score' and a[3] ~= b[3] then
      return a[3] > b[3]
    end
    return lt(a[1], b[1])
  end
  local function after_pos(c)
    if pos == '' then
      return true
    elseif order == 'lex' then
      return lt(pos, c[1])
    end
    return c[3] < ps or (c[3] == ps and lt(pm, c[1]))
  end
  -- The first room + 1 in order, by insertion (candidates are few, pages small).
  local best = {}
  for _, c in ipairs(cands) do
    if after_pos(c) and (#best <= room or before(c, best[#best])) then
      local i = #best
      while i >= 1 and before(c, best[i]) do
        best[i + 1] = best[i]
        i = i - 1
      end
      best[i + 1] = c
      if #best > room + 1 then
        best[#best] = nil
      end
    end
  end
  for i = 1, math.min(room, #best) do
    out[#out + 1] = best[i][1]
    kinds[#kinds + 1] = best[i][2]
  end
  if #best <= room then
    return true
  end
  local last = best[room]
  return false, order == 'score' and rank_bytes(last[3]) .. last[1] or last[1]
end

-- The scores of candidates, from the data hash.
local function add_scores(cands)
  for first = 1, #cands, 1000 do
    local ids = {}
    for i = first, math.min(first + 999, #cands) do
      ids[#ids + 1] = id_of(cands[i][1])
    end
    local values = redis.call('HMGET', data, unpack(ids))
    for i = 1, #values do
      cands[first + i - 1][3] = parse_value(values[i])
    end
  end
end

-- The vocabulary words starting with t, or nil when there are more than WORD_CAP.
local function words_starting(t)
  local words =
    redis.call('ZRANGE', vocab, '[' .. t, '(' .. t .. '\255', 'BYLEX', 'LIMIT', 0, WORD_CAP + 1)
  budget = budget - #words
  if #words > WORD_CAP then
    return nil
  end
  return words
end

-- The vocabulary words containing f (how = 'contains') or ending with it ('ends'), found through
-- the rarest gram of f; nil when f has no gram or the words are too many to merge.
local function words_with(f, how)
  local grams = grams_of(utf8_chars(f))
  local gk, gsize
  for g = 1, math.min(#grams, 24) do
    local k = base .. ':vg:' .. grams[g]
    local size = redis.call('SCARD', k)
    if size == 0 then
      return {}
    end
    if gk == nil or size < gsize then
      gk, gsize = k, size
    end
  end
  if gk == nil or gsize > gather then
    return nil
  end
  -- Redis picks the words out of the gram's set by pattern (its C code, not this script's;
  -- counted as an eighth of an entry each). A word holds no glob character (they separate
  -- words), but escape them anyway.
  local pattern = string.gsub(f, '[%*%?%[%]\\]', '\\%0')
  pattern = how == 'ends' and '*' .. pattern or '*' .. pattern .. '*'
  budget = budget - math.ceil(gsize / 8)
  local words, seen, cursor = {}, {}, '0'
  repeat
    local scan = redis.call('SSCAN', gk, cursor, 'MATCH', pattern, 'COUNT', gather)
    cursor = scan[1]
    for _, w in ipairs(scan[2]) do
      if not seen[w] then
        seen[w] = true
        words[#words + 1] = w
        if #words > WORD_CAP then
          return nil
        end
      end
    end
  until cursor == '0'
  budget = budget - #words
  return words
end

-- The number of terms in the postings of `words` (an upper bound of the terms having any).
local function postings_total(words)
  local total = 0
  for _, w in ipairs(words) do
    total = total + redis.call('ZCARD', base .. ':w:' .. w)
  end
  return total
end

-- Walks the union of the sorted sets `keys` (postings, or ranked sets when `ranked`) in order
-- from the position, a k-way merge: each set is read in chunks into a buffer; each round takes
-- the buffered entries up to the frontier (the smallest last buffered entry of the sets not yet
-- exhausted), in order, so every term up to it is seen, once; then it refills the buffers it
-- emptied, each set with four times its previous chunk (a set that runs dry first usually holds
-- the next entries too). Nothing is read twice.
local function merge(keys, want, ranked)
  local s = ranked and 9 or 1
  local first = math.max(2, math.min(need - #out + 1, math.floor(budget / (8 * #keys))))
  local sets = {}
  for i, k in ipairs(keys) do
    sets[i] = { key = k, buf = {}, at = 1, chunk = first, last = pos, done = false }
  end
  local lower = pos
  while true do
    local frontier
    for _, st in ipairs(sets) do
      if st.at > #st.buf and not st.done then
        if budget <= 0 then
          return false, lower
        end
        local chunk = math.max(2, math.min(st.chunk, budget))
        st.buf = redis.call('ZRANGE', st.key, st.last ~= '' and '(' .. st.last or '-', '+',
          'BYLEX', 'LIMIT', 0, chunk)
        st.at = 1
        budget = budget - #st.buf
        st.done = #st.buf < chunk
        if #st.buf > 0 then
          st.last = st.buf[#st.buf]
        end
        st.chunk = math.min(st.chunk * 4, 1024)
      end
      if not st.done and (frontier == nil or lt(st.last, frontier)) then
        frontier = st.last
      end
    end
    -- The matches up to the frontier, in order (a term in several postings, once).
    local cands, kind_of = {}, {}
    for _, st in ipairs(sets) do
      local buf, at = st.buf, st.at
      while at <= #buf and (frontier == nil or not lt(frontier, buf[at])) do
        local m = buf[at]
        local kind = accept(want, m, s)
        if kind > 0 and kind_of[m] == nil then
          kind_of[m] = kind
          cands[#cands + 1] = m
        end
        at = at + 1
      end
      st.at = at
    end
    sort_bytes(cands)
    for i, m in ipairs(cands) do
      out[#out + 1] = ranked and string.sub(m, 9) or m
      kinds[#kinds + 1] = kind_of[m]
      if #out >= need then
        if i == #cands and frontier == nil then
          return true
        end
        return false, m
      end
    end
    if frontier == nil then
      return true
    end
    lower = frontier
  end
end

-- Reads the entries of the lex-ordered sets srcs from lo to hi whole, keeps those `want` accepts
-- and takes a page of them. Returns nil when there are more than `gather` (or cap) entries.
local function gather_range(srcs, lo, hi, want, cap)
  local count = 0
  for _, src in ipairs(srcs) do
    count = count + redis.call('ZLEXCOUNT', src, lo, hi)
  end
  if count > (cap or gather) then
    return nil
  end
  if count > budget and #out > 0 then
    return false, pos
  end
  budget = budget - count
  local cands = {}
  for _, src in ipairs(count > 0 and srcs or {}) do
    for _, m in ipairs(redis.call('ZRANGE', src, lo, hi, 'BYLEX')) do
      local kind = accept(want, m, 1)
      if kind > 0 then
        cands[#cands + 1] = { m, kind, 0 }
      end
    end
  end
  if order == 'score' then
    add_scores(cands)
  end
  return take_page(cands)
end

-- Merges the postings of `words` (terms having any of them), keeps what `want` accepts and takes
-- a page. Returns nil when they hold more than `gather` terms.
local function gather_words(words, want)
  local total = postings_total(words)
  if total > gather then
    return nil
  end
  if total > budget and #out > 0 then
    return false, pos
  end
  budget = budget - total
  local seen, cands = {}, {}
  for _, w in ipairs(words) do
    for _, m in ipairs(redis.call('ZRANGE', base .. ':w:' .. w, 0, -1)) do
      if not seen[m] then
        seen[m] = true
        local kind = accept(want, m, 1)
        if kind > 0 then
          cands[#cands + 1] = { m, kind, 0 }
        end
      end
    end
  end
  if order == 'score' then
    add_scores(cands)
  end
  return take_page(cands)
end

-- The vocabulary words one of which every match of `want` has, or nil when the query gives no
-- such handle (too short, or too common).
local function word_list(want)
  local word_mode = want == 'word' or want == WORD
  -- A query word with a separator (or the query's edge, in word mode) on both sides is a
  -- whole word of every match: take the rarest.
  local best, best_size
  for i, t in ipairs(tokens) do
    local whole_start = i > 1 or starts_sep or word_mode
    local whole_end = i < #tokens or ends_sep
    if whole_start and whole_end then
      local size = redis.call('ZCARD', base .. ':w:' .. t)
      if best == nil or size < best_size then
        best, best_size = t, size
      end
    end
  end
  if best then
    return { best }
  end
  if #tokens == 0 then
    return nil
  end
  if word_mode then
    -- One query word, the start of a word of every match.
    return words_starting(tokens[1])
  end
  -- Otherwise every match has a word containing the query's only word, or ending with its
  -- first word, or starting with its last: take the candidate set with the fewest terms.
  local first, last = tokens[1], tokens[#tokens]
  local options = {}
  if #tokens == 1 and not starts_sep and not ends_sep then
    options[1] = words_with(first, want == 'suffix' and 'ends' or 'contains')
  else
    if not starts_sep then
      options[#options + 1] = words_with(first, 'ends')
    end
    if not ends_sep then
      options[#options + 1] = words_starting(last)
    end
  end
  local chosen, chosen_total
  for _, words in pairs(options) do
    local total = postings_total(words)
    if chosen == nil or total < chosen_total then
      chosen, chosen_total = words, total
    end
  end
  return chosen
end

-- The keys of the dictionary's lex sets, in byte order, with their first bytes.
local function lex_sets()
  local names, bytes = all_lex_names()
  local exists = redis.call('HMGET', heavy_set, unpack(names))
  local keys, firsts = {}, {}
  for i = 1, #names do
    if exists[i] then
      keys[#keys + 1] = base .. ':' .. names[i]
      firsts[#firsts + 1] = bytes[i]
    end
  end
  return keys, firsts
end

-- Walks the whole dictionary in lexicographic order from the position, checking each term: the
-- lex sets one after the other. Returns done, next position.
local function walk_all(want)
  local keys, firsts = lex_sets()
  local at = pos ~= '' and string.byte(pos, 1) or 0
  for i = 1, #keys do
    if firsts[i] >= at then
      local lo = (pos ~= '' and firsts[i] == at) and '(' .. pos or '-'
      local done, next_pos = walk(keys[i], lo, '+', false, want)
      if not done then
        return false, next_pos
      end
      if (#out >= need or budget <= 0) and i < #keys then
        -- Stopped at the end of a set: go on after it.
        return false, string.char(firsts[i]) .. '\255'
      end
    end
  end
  return true
end

-- Runs one group (or a whole non-automatic mode) from pos. Returns done, next position.
local function run(want)
  local lo, hi
  if want == EXACT then
    lo, hi = '[' .. Q .. '\0', '(' .. Q .. '\1'
  elseif want == PREFIX or want == 'prefix' then
    lo, hi = '[' .. Q, '(' .. Q .. '\255'
  end
  if lo then
    if order == 'lex' then
      return walk(lex, from(lo), hi, false, want)
    end
    local list, has = {}, {}
    if want ~= EXACT then
      list = ranked_prefixes(Q, max_depth)
      for l = 1, #list do
        list[l] = { list[l], set_name(list[l]) }
        has[l] = list[l][2]
      end
      has = redis.call('HMGET', heavy_set, unpack(has))
      if list[#list][1] == Q and has[#list] then
        return walk(base .. ':' .. list[#list][2], from('-'), '+', true, want)
      end
    end
    -- Few terms: rank them here. (A prefix of at most `max_depth` characters without a ranked
    -- set has at most `heavy` terms.)
    local done, at = gather_range({ lex }, lo, hi, want, heavy)
    if done ~= nil then
      return done, at
    end
    -- Many terms, no ranked set of their own (the prefix is longer than `max_depth`): walk the
    -- ranked set of the longest shorter prefix that has one, checking each term.
    for l = #list, 1, -1 do
      if has[l] and #list[l][1] < #Q then
        return walk(base .. ':' .. list[l][2], from('-'), '+', true, want)
      end
    end
  else
    local words = word_list(want)
    if words ~= nil then
      if #words == 0 then
        return true
      end
      local done, at
      if #words == 1 and order == 'lex' then
        return walk(base .. ':w:' .. words[1], from('-'), '+', false, want)
      elseif order == 'lex' then
        if #words <= MERGE_CAP then
          local keys = {}
          for i, w in ipairs(words) do
            keys[i] = base .. ':w:' .. w
          end
          return merge(keys, want, false)
        end
      elseif #words == 1 then
        done, at = gather_range({ base .. ':w:' .. words[1] }, '-', '+', want)
      else
        done, at = gather_words(words, want)
      end
      if done ~= nil then
        return done, at
      end
    end
    if order == 'lex' then
      return walk_all(want)
    end
  end
  -- Score order over many candidates: walk the whole dictionary best first, checking each: the
  -- top set (add.lua) while the position is in it, then the union of the ranked sets of its
  -- first bytes (at most 178, however large the dictionary is), merged.
  if redis.call('HGET', heavy_set, '') then
    local top = base .. ':top'
    local last = redis.call('ZRANGE', top, -1, -1)[1]
    if last and (pos == '' or lt(pos, last)) then
      local done, at = walk(top, from('-'), '+', true, want)
      if not done then
        return false, at
      end
      if #out >= need or budget <= 0 then
        return false, last
      end
      pos = last
    end
    local names = {}
    for b = 1, 244 do
      if b < 128 or b >= 194 then
        names[#names + 1] = set_name(string.char(b))
      end
    end
    local has = redis.call('HMGET', heavy_set, unpack(names))
    local keys = {}
    for i = 1, #names do
      if has[i] then
        keys[#keys + 1] = base .. ':' .. names[i]
      end
    end
    return merge(keys, want, true)
  end
  -- Not ranked: the dictionary has at most `heavy` terms.
  local done, at = gather_range(lex_sets(), '-', '+', want)
  if done == nil then
    return walk_all(want)
  end
  return done, at
end

local next_group, next_pos = 0, ''
if mode ~= 'auto' then
  local done, at = run(mode)
  if not done then
    next_group, next_pos = 1, at
  end
else
  local groups = { EXACT, PREFIX, WORD, CONTAINS }
  local index = 1
  while groups[index] ~= group do
    index = index + 1
    if index > #groups then
      return redis.error_reply('ERR unknown group')
    end
  end
  while true do
    local done, at = run(groups[index])
    if not done then
      next_group, next_pos = groups[index], at
      break
    end
    index = index + 1
    pos = ''
    if index > #groups then
      break
    end
    if #out >= need or budget <= 0 then
      next_group = groups[index]
      break
    end
  end
end

local reply = { next_group, next_pos }
if #out > 0 then
  local ids = {}
  for i = 1, #out do
    ids[i] = id_of(out[i])
  end
  local values = redis.call('HMGET', data, unpack(ids))
  for i = 1, #out do
    reply[#reply + 1] = ids[i]
    reply[#reply + 1] = values[i]
    reply[#reply + 1] = kinds[i]
  end
end
return reply
