-- Complete: one page of a dictionary's terms matching a query. Reads only (flags=no-writes).
--
-- KEYS[1] lex   KEYS[2] data   KEYS[3] vocab   (as in add.lua)
-- ARGV[1] base (as in add.lua: <base>:r:<prefix>, <base>:w:<word>, <base>:vg:<gram>)
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
-- ARGV[13] heavy: prefixes of at most `max depth` characters with more terms have a ranked set
-- ARGV[14..] the query's words (runs of non-separators), in order
--
-- Returns {next group, next position, then per result: id, data value, match kind}; the next
-- group is 0 when there are no more results.
--
-- Where results come from, all read in the result order from the position on, so that a page
-- never depends on an offset:
-- - prefix, lexicographic: the lex set's range of the prefix;
-- - prefix, by score: the prefix's ranked set, or, for a prefix with at most `heavy` terms
--   (add.lua), that range of the lex set ranked here;
-- - word prefix, suffix, contains: the terms having one vocabulary word (the query's rarest
--   whole word, the words starting with it, or the words containing its longest fragment), one
--   posting walked in order or several merged here when they hold at most `gather` terms;
--   otherwise the query is common and the lex set (or the whole dictionary's ranked set) is walked
--   checking each term.
-- No call looks at more than about `budget` entries; a page cut short by the budget carries a
-- position to go on from.
local lex, data, vocab = KEYS[1], KEYS[2], KEYS[3]
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
for i = 14, #ARGV do
  tokens[#tokens + 1] = ARGV[i]
end
local root = base .. ':r:'
-- The most vocabulary words whose postings one call gathers, and merges in lex order.
local WORD_CAP, MERGE_CAP = 256, 32

local out, kinds = {}, {} -- lex members of the results, and how they matched

local function id_of(lexm)
  return string.sub(lexm, string.find(lexm, '\0', 1, true) + 1)
end

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
  budget = budget - gsize
  local words = {}
  for _, w in ipairs(redis.call('SMEMBERS', gk)) do
    local ok
    if how == 'ends' then
      ok = #w >= #f and string.sub(w, #w - #f + 1) == f
    else
      ok = string.find(w, f, 1, true) ~= nil
    end
    if ok then
      words[#words + 1] = w
      if #words > WORD_CAP then
        return nil
      end
    end
  end
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

-- Walks the union of the postings of `words` in lex order from the position: each round reads
-- the next entries of every posting up to a common frontier (the smallest last entry of the
-- postings not yet exhausted), so every term up to it is seen, once.
local function merge_words(words, want)
  local keys = {}
  for i, w in ipairs(words) do
    keys[i] = base .. ':w:' .. w
  end
  local lower = pos
  local chunk = need - #out + 1
  while budget > 0 do
    chunk = math.max(math.min(chunk, math.floor(budget / #keys)), 2)
    local frontier, got = nil, {}
    for _, k in ipairs(keys) do
      local batch =
        redis.call('ZRANGE', k, lower ~= '' and '(' .. lower or '-', '+', 'BYLEX', 'LIMIT', 0, chunk)
      budget = budget - #batch
      if #batch == chunk and (frontier == nil or lt(batch[#batch], frontier)) then
        frontier = batch[#batch]
      end
      for _, m in ipairs(batch) do
        got[#got + 1] = m
      end
    end
    local seen, cands = {}, {}
    for _, m in ipairs(got) do
      if not seen[m] and (frontier == nil or not lt(frontier, m)) then
        seen[m] = true
        local kind = accept(want, m, 1)
        if kind > 0 then
          cands[#cands + 1] = { m, kind }
        end
      end
    end
    table.sort(cands, function(a, b)
      return lt(a[1], b[1])
    end)
    for i, c in ipairs(cands) do
      out[#out + 1] = c[1]
      kinds[#kinds + 1] = c[2]
      if #out >= need then
        if i == #cands and frontier == nil then
          return true
        end
        return false, c[1]
      end
    end
    if frontier == nil then
      return true
    end
    lower = frontier
    chunk = math.min(chunk * 2, 1024)
  end
  return false, lower
end

-- Reads the entries of the lex-ordered src from lo to hi whole, keeps those `want` accepts and
-- takes a page of them. Returns nil when there are more than `gather` entries.
local function gather_range(src, lo, hi, want, cap)
  local count = redis.call('ZLEXCOUNT', src, lo, hi)
  if count > (cap or gather) then
    return nil
  end
  if count > budget and #out > 0 then
    return false, pos
  end
  budget = budget - count
  local cands = {}
  if count > 0 then
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
    local rk = root .. Q
    if want ~= EXACT and redis.call('EXISTS', rk) == 1 then
      return walk(rk, from('-'), '+', true, want)
    end
    -- Few terms: rank them here. (A prefix of at most `max_depth` characters without a ranked
    -- set has at most `heavy` terms.)
    local done, at = gather_range(lex, lo, hi, want, heavy)
    if done ~= nil then
      return done, at
    end
    -- Many terms, no ranked set of their own (the prefix is longer than `max_depth`): walk the
    -- ranked set of the longest shorter prefix that has one, checking each term.
    local cuts = {}
    for i = 2, #Q do
      local b = string.byte(Q, i)
      if b < 128 or b >= 192 then
        cuts[#cuts + 1] = i - 1
        if #cuts >= max_depth then
          break
        end
      end
    end
    for c = #cuts, 1, -1 do
      local ak = root .. string.sub(Q, 1, cuts[c])
      if redis.call('EXISTS', ak) == 1 then
        return walk(ak, from('-'), '+', true, want)
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
          return merge_words(words, want)
        end
      elseif #words == 1 then
        done, at = gather_range(base .. ':w:' .. words[1], '-', '+', want)
      else
        done, at = gather_words(words, want)
      end
      if done ~= nil then
        return done, at
      end
    end
    if order == 'lex' then
      return walk(lex, from('-'), '+', false, want)
    end
  end
  -- Score order over many candidates: walk the whole dictionary best first, checking each.
  if redis.call('EXISTS', root) == 1 then
    return walk(root, from('-'), '+', true, want)
  end
  -- No ranked set of the whole dictionary: it has at most `heavy` terms.
  local done, at = gather_range(lex, '-', '+', want)
  if done == nil then
    return walk(lex, from('-'), '+', false, want)
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
