-- Fuzzy completion, one step: the terms a prefix of which is within `max edits` edits of the
-- query (optimal string alignment distance over characters: substitution, insertion, deletion,
-- transposition of adjacent characters), walked in steps of bounded work that Baton chains into
-- one page. Reads only (flags=no-writes).
--
-- KEYS[1] data   KEYS[2] h (the heavy hash: 'l:XX' -> 1 for every lex set there is)
-- KEYS[3..] every lex set there can be, in byte order (all_lex_names)
-- ARGV[1] order: 'lex' | 'score'   ARGV[2] limit   ARGV[3] max edits (0 to 2)
-- ARGV[4] this step's call budget: the most Redis reads of index sets   ARGV[5] its entry
--         budget: the most lex members those reads may return
-- ARGV[6] the normalized query (at most 32 characters)
-- ARGV[7] base   ARGV[8] max depth   ARGV[9] heavy (as in ranked.lua)
-- ARGV[10] the stage to start at: 0 is group 0 (the query's own range); 2t - 1 the walk of
--          distance t under the query's first character (by score only), 2t the rest of it
-- ARGV[11] the position in that stage: everything before it in the stage's byte order is done
--          ('' for the stage's start)
-- ARGV[12] matches found in the groups before the stage's   ARGV[13] in the stage's group
-- ARGV[14] when the position is a trie node whose best-first read an earlier step began: the
--          ranked member that read stopped at ('' otherwise)   ARGV[15] the matches that read
--          found so far
--
-- Returns {1 when every stage is done (else 0: the step's budget ran out first), the stage and
-- the position to go on from, the calls and entries the step used, the matches it found at
-- distance 0, 1 and 2, where a best-first read goes on from and its matches so far (ARGV[14] and
-- ARGV[15] of the next step), then per match kept (at most `limit` of each distance, the first
-- by their sort key): distance, sort key (the lex member; by score, rank bytes then the lex
-- member), id, data value, match kind (EXACT, PREFIX or FUZZY)}.
--
-- The lex sets are walked as a trie of characters: the children of a prefix p are found by a
-- skip scan (ZRANGE (p<c>\255 ... BYLEX LIMIT 0 1 gives the next existing character after c),
-- and each trie node carries its row of the edit-distance table against the query, so a branch
-- is left as soon as every cell of its row is over the threshold. The walk is made once per
-- distance t = 1, 2 (distance 0 is the query's prefix range, read directly), collecting the terms
-- whose distance is exactly t: a branch whose best distance so far is below t holds only terms of
-- an earlier group, and is skipped. A node's distance to the query can only improve over the
-- next `max edits` characters, so a node t characters longer than the query is a leaf whose
-- whole range is one group. A node whose row's least cell is t has no descendant closer than t:
-- at distance t its whole range is the group's; farther, only the rest of the query from a cell
-- at t (or after transposing its last character with the next) can reach t, and the range of
-- each such continuation is read at once (node).
-- Each walk visits nodes in byte order, so a group's terms are found in lexicographic order; by
-- score they are ranked (by Baton, over the steps), and the walk starts at the query's first
-- character, so that a walk the budget cuts short has looked there first. By score, when the
-- dictionary has ranked sets, a range of more than `heavy` terms whose terms are all within the
-- walk's distance is not read whole: its best terms at exactly that distance are read best first
-- (best.lua), as many as the page can take, each checked for a closer prefix.
--
-- Steps: the walk's order is fixed by the query, so a position (a lex member or a prefix followed
-- by \255, everything before which is done) says where a step stopped; the next step walks down
-- to it again from the root, seeking past what is done, and goes on. A range read whole moves the
-- position member by member, a node it leaves moves it past the node. A best-first read that the
-- budget cuts short leaves the position at its node (the prefix itself, which sorts after what is
-- done before the node and before all of the node's range) with the ranked member it stopped at,
-- and the next step's read of that node goes on from there.
local order, need, maxk = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local calls, entries = tonumber(ARGV[4]), tonumber(ARGV[5])
local given_calls, given_entries = calls, entries
local qs = ARGV[6]
local q = utf8_chars(qs)
local n = #q
local data, heavy = KEYS[1], KEYS[2]
local base, depth, heavy_terms = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
-- Score order over ranked sets (their reads derive their keys from base, like ranked.lua's).
local ranked = order == 'score' and has_feature(features_of(base .. ':f'), 'r')
local names, firsts = all_lex_names()
local set_of = {} -- first byte -> lex set key
for i = 1, #firsts do
  set_of[firsts[i]] = KEYS[2 + i]
end

local exhausted = false -- whether this step's budget ran out
local groups = { [0] = {}, {}, {} } -- lex members found in this step, per distance
local stage, X = tonumber(ARGV[10]), ARGV[11] -- where this step starts; X is '' past its stage
local pos = X -- where the next step would start, in the current stage
local before, have = tonumber(ARGV[12]), tonumber(ARGV[13]) -- matches of earlier steps
-- A best-first read of node X to go on with (from after ranked member R, with G matches found),
-- and where this step's own read stopped (the next step's R and G).
local R, G = ARGV[14], tonumber(ARGV[15])
local resume, resume_got = '', 0

-- Whether the group being walked (in `found`) can stop: in lexicographic order once the page is
-- full, as the walk finds terms in order; by score only when the whole group is seen.
local function full(found)
  return order == 'lex' and before + have + #found >= need
end

-- Reads the members of set from lo to hi (ZRANGE BYLEX bounds) into found, within the budgets.
local function take(found, set, lo, hi)
  local cur = lo
  while not full(found) do
    if calls <= 0 or entries <= 0 then
      exhausted = true
      return
    end
    local chunk = math.min(entries, 256)
    if order == 'lex' then
      chunk = math.min(chunk, need - before - have - #found)
    end
    calls = calls - 1
    local rows = redis.call('ZRANGE', set, cur, hi, 'BYLEX', 'LIMIT', 0, chunk)
    entries = entries - #rows
    for i = 1, #rows do
      found[#found + 1] = rows[i]
    end
    if #rows > 0 then
      pos = rows[#rows]
    end
    if #rows < chunk then
      return
    end
    cur = '(' .. rows[#rows]
  end
end

-- The first member of set from lo below hi, or nil (then `exhausted` says whether for lack of
-- budget).
local function next_member(set, lo, hi)
  if calls <= 0 then
    exhausted = true
    return nil
  end
  calls = calls - 1
  return redis.call('ZRANGE', set, lo, hi, 'BYLEX', 'LIMIT', 0, 1)[1]
end

-- The character of s starting at byte i.
local function char_at(s, i)
  local b = byte(s, i)
  local len = b < 128 and 1 or b < 224 and 2 or b < 240 and 3 or 4
  return sub(s, i, i + len - 1)
end

-- The edit-distance row of prefix p .. c against the query, from the rows of p (prev) and of p
-- without its last character pc (pprev, nil at the root); and the row's smallest cell.
local function next_row(prev, pprev, c, pc)
  local row = { [0] = prev[0] + 1 }
  local least = row[0]
  for j = 1, n do
    local v = prev[j] + 1
    local w = row[j - 1] + 1
    if w < v then
      v = w
    end
    w = prev[j - 1] + (q[j] == c and 0 or 1)
    if w < v then
      v = w
    end
    if pprev ~= nil and j > 1 and c == q[j - 1] and pc == q[j] then
      w = pprev[j - 2] + 1
      if w < v then
        v = w
      end
    end
    row[j] = v
    if v < least then
      least = v
    end
  end
  return row, least
end

-- Whether some prefix of `key` longer than node p (of `plen` bytes; row is its row, prow its
-- parent's, last its last character) comes closer to the query than t.
local function closer(key, plen, row, prow, last, t)
  local i = plen + 1
  while i <= #key do
    local c = char_at(key, i)
    local crow, cleast = next_row(row, prow, c, last)
    if crow[n] < t then
      return true
    end
    if cleast >= t then
      return false -- no cell of a longer prefix's row goes below this row's least
    end
    row, prow, last = crow, row, c
    i = i + #c
  end
  return false
end

-- By score over ranked sets, whether the range of p in lex set `set` is too large to read whole.
-- Also returns the range's size when it was counted (nil when not).
local function large(set, p)
  if not ranked or calls <= 0 then
    return false, nil
  end
  calls = calls - 1
  local count = redis.call('ZLEXCOUNT', set, '[' .. p, '(' .. p .. '\255')
  return count > heavy_terms, count
end

-- Adds to found the best terms of p's range (all within distance t of the query: p is) whose
-- distance is exactly t, as many as the page can still take, read best first from the ranked
-- sets. A `row` of nil takes every term (none can come closer).
-- A read an earlier step began (the position is p, R where it stopped) goes on after R, for what
-- the page can still take beyond the G matches it found; one the budget cuts short here leaves
-- the position at p.
local function best_in(found, t, set, p, row, prow, last)
  local from, got = '', 0
  if R ~= '' and p == X then
    from, got = R, G
  end
  local want = need - before - got
  if want <= 0 then
    return
  end
  local keep = nil
  if row ~= nil then
    keep = function(m)
      return not closer(sub(m, 9, find(m, '\0', 9, true) - 1), #p, row, prow, last, t)
    end
  end
  local rows, stopped, spent, used = best_of(base, set, data, heavy, p, want - 1, from,
    depth, heavy_terms, math.min(entries, calls), keep)
  entries, calls = entries - spent, calls - used
  local took = math.min(#rows, want)
  for i = 1, took do
    found[#found + 1] = sub(rows[i], 9)
  end
  if stopped then
    exhausted = true
    pos, resume, resume_got = p, stopped, got + took
  end
end

-- Whether everything under prefix p was done by an earlier step (the start is past it).
local function done(p)
  return X ~= '' and not lt(X, p .. '\255')
end

-- Whether the start of this step falls within p's range: some of it was done.
local function within(p)
  return X ~= '' and lt(p, X)
end

-- Reads the range of node p, every term of which is at distance t (none closer), into found:
-- best first when it is large, else whole; within the start of the step, from there on.
local function whole(found, t, set, p)
  if within(p) then
    take(found, set, '(' .. X, '(' .. p .. '\255')
    return
  end
  local big, count = large(set, p)
  if big then
    best_in(found, t, set, p, nil)
  elseif count ~= 0 then
    take(found, set, '[' .. p, '(' .. p .. '\255')
  end
end

-- Visits trie node p (depth characters, in lex set `set`) for the walk of distance t: row is its
-- row, prow its parent's, last its last character, hit the best distance of p and its prefixes.
-- Within the start of the step, it seeks past what is done.
local visit
local function node(found, t, set, p, depth, row, least, prow, last, hit)
  if row[n] < hit then
    hit = row[n]
  end
  if hit < t then
    return -- every term below has a distance below t: an earlier group's
  end
  if depth >= n + t or least > t or (least == t and hit == t) then
    -- No longer prefix comes closer than t (no cell of a descendant's row is below the least
    -- of this row or of its parent's less one): the whole range is at distance hit.
    if hit == t then
      whole(found, t, set, p)
    end
    return
  end
  if hit == t and not within(p) and large(set, p) then
    -- Every term of p is within t, some closer: the best of those at t, checked one by one.
    best_in(found, t, set, p, row, prow, last)
    return
  end
  if least == t then
    -- No edit left and none made yet within t: a match below p goes on with the rest of the
    -- query from a cell of the row at t, or transposes p's last character with the next one
    -- and then goes on with the rest. So the range of each such continuation is read at once
    -- (empty when no term has it), not looked up a character at a time.
    local rests, seen = {}, {}
    local function add(s)
      if not seen[s] then
        seen[s] = true
        rests[#rests + 1] = s
      end
    end
    for j = 1, n do
      if row[j - 1] == t then
        add(table.concat(q, '', j, n))
      end
      if j > 1 and prow ~= nil and last == q[j] and prow[j - 2] + 1 <= t then
        add(q[j - 1] .. table.concat(q, '', j + 1, n))
      end
    end
    table.sort(rests, lt)
    local under -- the last continuation read: one it starts is within its range, read with it
    for _, s in ipairs(rests) do
      if exhausted or full(found) then
        return
      end
      if under == nil or sub(s, 1, #under) ~= under then
        under = s
        -- Every term under p .. s is at distance t: the row of p .. s reaches the query's end
        -- at t, and no cell of a row below p is under t. So its range is the group's, as a
        -- visit would find it, without the rows of the characters between.
        local ps = p .. s
        if not done(ps) then
          whole(found, t, set, ps)
          if not exhausted then
            pos = ps .. '\255'
          end
        end
      end
    end
    return
  end
  local lo, hi = '(' .. p .. '\0\255', '(' .. p .. '\255'
  if not within(p) then
    if hit == t then
      take(found, set, '[' .. p .. '\0', '(' .. p .. '\1') -- the terms equal to p
    end
  elseif lt(X, p .. '\1') then
    if hit == t then
      take(found, set, '(' .. X, '(' .. p .. '\1') -- the rest of the terms equal to p
    end
  else
    lo = '[' .. p .. char_at(X, #p + 1) -- the children from the one the start is in
  end
  while not exhausted and not full(found) do
    local m = next_member(set, lo, hi)
    if m == nil then
      return
    end
    local c = char_at(m, #p + 1)
    local crow, cleast = next_row(row, prow, c, last)
    visit(found, t, set, p .. c, depth + 1, crow, cleast, row, c, hit)
    lo = '(' .. p .. c .. '\255'
  end
end

-- node, skipping what earlier steps did, and moving the position past p once it is done.
visit = function(found, t, set, p, depth, row, least, prow, last, hit)
  if done(p) then
    return
  end
  node(found, t, set, p, depth, row, least, prow, last, hit)
  if not exhausted then
    pos = p .. '\255'
  end
end

local root = { [0] = 0 }
for j = 1, n do
  root[j] = j
end
local present

-- Stage 0, group 0: the terms starting with the query.
local function group_zero()
  local set = set_of[byte(qs)]
  if set == nil then
    return
  end
  if R ~= '' or X == qs then
    -- A best-first read an earlier step began (a range read whole leaves lex members instead).
    best_in(groups[0], 0, set, qs, nil)
  elseif X ~= '' then
    take(groups[0], set, '(' .. X, '(' .. qs .. '\255')
  elseif large(set, qs) then
    best_in(groups[0], 0, set, qs, nil)
  else
    take(groups[0], set, '[' .. qs, '(' .. qs .. '\255')
  end
end

-- The walk of distance t under the query's own first character. By score a group is ranked
-- whole, so the order of the walk changes no complete group: it starts there, where a walk the
-- budget cuts short finds the likeliest matches (a typo is rarely the first character), then
-- takes the others in byte order. In lexicographic order the walk keeps to byte order, as it
-- stops once the page is full.
local function walk_own(t)
  local own = char_at(qs, 1)
  local set = set_of[byte(qs)]
  if set ~= nil and next_member(set, '[' .. own, '(' .. own .. '\255') ~= nil then
    local crow, cleast = next_row(root, nil, own, nil)
    visit(groups[t], t, set, own, 1, crow, cleast, root, own, n)
  end
end

-- The walk of distance t from the first characters of the lex sets that exist (but the query's
-- own by score, walked before).
local function walk_rest(t)
  local found = groups[t]
  local own = order == 'score' and char_at(qs, 1) or nil
  if present == nil then
    if calls <= 0 then
      exhausted = true
      return
    end
    calls = calls - 1
    present = redis.call('HMGET', heavy, unpack(names))
  end
  local from = X ~= '' and byte(X) or nil -- the first byte of the step's start
  for i = 1, #names do
    if exhausted or full(found) then
      break
    end
    local ahead = present[i] and (from == nil or firsts[i] >= from)
    if ahead and firsts[i] < 128 then
      -- The set of a one-byte character holds the terms starting with it alone: no scan.
      local c = string.char(firsts[i])
      if c ~= own then
        local crow, cleast = next_row(root, nil, c, nil)
        visit(found, t, KEYS[2 + i], c, 1, crow, cleast, root, c, n)
      end
    elseif ahead then
      local set = KEYS[2 + i]
      local lo = '-'
      if from == firsts[i] then
        lo = '[' .. char_at(X, 1)
      end
      while not exhausted and not full(found) do
        local m = next_member(set, lo, '+')
        if m == nil then
          break
        end
        local c = char_at(m, 1)
        if c ~= own then
          local crow, cleast = next_row(root, nil, c, nil)
          visit(found, t, set, c, 1, crow, cleast, root, c, n)
        end
        lo = '(' .. c .. '\255'
      end
    end
  end
end

-- The stages, from where the step starts until its budget runs out or the page is known.
local finished = false
while true do
  local t = math.floor((stage + 1) / 2)
  if stage == 0 then
    group_zero()
  elseif stage % 2 == 1 then
    if order == 'score' then
      walk_own(t)
    end
  else
    walk_rest(t)
  end
  if exhausted then
    break
  end
  if full(groups[t]) or stage == 2 * maxk then
    finished = true
    break
  end
  if stage % 2 == 0 then
    -- Group t is whole: the next group is walked only if the page has room left.
    before, have = before + have + #groups[t], 0
    if before >= need then
      finished = true
      break
    end
  end
  stage, X, pos, R, G = stage + 1, '', '', '', 0
end

-- The reply: what the step found, and its first matches of each distance by sort key.
local reply = { finished and 1 or 0, stage, pos, math.max(given_calls - calls, 0),
  math.max(given_entries - entries, 0), #groups[0], #groups[1], #groups[2], resume, resume_got }
for t = 0, 2 do
  local found = groups[t]
  local rows = {}
  if order == 'score' then
    -- By score every match's value is needed to rank it; a term's ranked member (rank bytes,
    -- then its lex member) sorts in result order byte by byte.
    for first_row = 1, #found, 1000 do
      local ids = {}
      for i = first_row, math.min(first_row + 999, #found) do
        ids[#ids + 1] = id_of(found[i])
      end
      local values = redis.call('HMGET', data, unpack(ids))
      for i = 1, #ids do
        local v = values[i]
        if v then -- always, as reads are atomic; a term is whole or absent
          local m = found[first_row + i - 1]
          rows[#rows + 1] = { rank_bytes((parse_value(v))) .. m, m, ids[i], v }
        end
      end
    end
    local keyed, by_key = {}, {}
    for i, r in ipairs(rows) do
      keyed[i], by_key[r[1]] = r[1], r
    end
    sort_bytes(keyed)
    for i, k in ipairs(keyed) do
      rows[i] = by_key[k]
    end
  else
    -- In lexicographic order the walk found them in order: the first ones are the page's.
    local ids = {}
    for i = 1, math.min(need, #found) do
      ids[i] = id_of(found[i])
    end
    if #ids > 0 then
      local values = redis.call('HMGET', data, unpack(ids))
      for i = 1, #ids do
        if values[i] then
          rows[#rows + 1] = { found[i], found[i], ids[i], values[i] }
        end
      end
    end
  end
  for i = 1, math.min(need, #rows) do
    local r = rows[i]
    local kind = 6 -- FUZZY
    if t == 0 then
      kind = find(r[2], '\0', 1, true) == #qs + 1 and 1 or 2 -- EXACT or PREFIX
    end
    reply[#reply + 1] = t
    reply[#reply + 1] = r[1]
    reply[#reply + 1] = r[3]
    reply[#reply + 1] = r[4]
    reply[#reply + 1] = kind
  end
end
return reply
