-- Prefix completion by score, outside automatic mode: the fast path of complete.lua for it (the
-- same results and reply, with a smaller script). Reads only (flags=no-writes).
--
-- KEYS[1] the lex set of the query's first byte   KEYS[2] data   KEYS[3] heavy   (as in add.lua;
--         the features hash, <base>:f, is derived like the sets: declaring a key that may not
--         exist would have a Cluster refuse the read while the slot migrates)
-- ARGV[1] base (as in add.lua)   ARGV[2] limit   ARGV[3] the normalized query
-- ARGV[4] where the previous page stopped, exclusive: '' or a ranked member
-- ARGV[5] max depth, ARGV[6] heavy, ARGV[7] budget (as in complete.lua)
--
-- Returns {1 when there may be more (else 0), the next position, then per result: id, data
-- value, match kind (EXACT or PREFIX)}, or {-1, 'r', ''} when the dictionary has no ranked sets
-- (features.lua).
--
-- The results come from the query's own ranked set when it has one; else, when the query has
-- at most `heavy` terms, from its range of the lex set, ranked here; else (a prefix longer than
-- `max depth`) from the deep set of its first `max depth` + 1 characters (add.lua) while the
-- position is within its bound, then from the ranked set of its longest prefix that has one,
-- walked best first checking each term, looking at no more than `budget` entries in all.
local lex, data, heavy_set = KEYS[1], KEYS[2], KEYS[3]
if not has_feature(features_of(ARGV[1] .. ':f'), 'r') then
  return refusal(ARGV[1] .. ':f', 'r')
end
local base, need, q, pos = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local depth, heavy, budget = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])

local list = ranked_prefixes(q, depth)
local names = {}
for i = 1, #list do
  names[i] = set_name(list[i])
end
local deep = first_chars(q, depth + 1)
if deep then
  names[#list + 1] = 't:' .. deep
end
local has = redis.call('HMGET', heavy_set, unpack(names))
local hi = '(' .. q .. '\255'

-- Up to need + 1 ranked members of results, in order (one more than a page tells there is
-- more); and where to go on from when the budget ran out first.
local rows, stopped = {}, nil

-- Walks src best first from `from` (exclusive; '' for the start), keeping the entries with
-- prefix q, until a page and one more are found, src runs out (returns true), or the budget
-- does (sets `stopped`).
local function walk(src, from)
  local cur, last, grow = from ~= '' and '(' .. from or '-', nil, need + 1
  while #rows <= need do
    if budget <= 0 then
      stopped = last or from
      return false
    end
    local chunk = math.min(budget, grow)
    grow = math.min(math.max(grow * 2, 64), 1024)
    local batch = redis.call('ZRANGE', src, cur, '+', 'BYLEX', 'LIMIT', 0, chunk)
    budget = budget - #batch
    for _, m in ipairs(batch) do
      last = m
      if find(m, q, 9, true) == 9 then
        rows[#rows + 1] = m
        if #rows > need then
          return false
        end
      end
    end
    if #batch < chunk then
      return true
    end
    cur = '(' .. last
  end
  return false
end

if list[#list] == q and has[#list] then
  -- Its own set: every entry is a result.
  rows = redis.call('ZRANGE', base .. ':' .. names[#list], pos ~= '' and '(' .. pos or '-', '+',
    'BYLEX', 'LIMIT', 0, need + 1)
elseif redis.call('ZLEXCOUNT', lex, '[' .. q, hi) <= heavy then
  -- Few terms: rank them here.
  local members = redis.call('ZRANGE', lex, '[' .. q, hi, 'BYLEX')
  if #members > 0 then
    local ids = {}
    for i, m in ipairs(members) do
      ids[i] = id_of(m)
    end
    local values = redis.call('HMGET', data, unpack(ids))
    local ranked = {}
    for i, m in ipairs(members) do
      local r = rank_bytes((parse_value(values[i]))) .. m
      if pos == '' or lt(pos, r) then
        ranked[#ranked + 1] = r
      end
    end
    if BYTEWISE then
      table.sort(ranked)
    else
      table.sort(ranked, lt)
    end
    for i = 1, math.min(#ranked, need + 1) do
      rows[i] = ranked[i]
    end
  end
else
  -- Many terms, no ranked set of their own: the deep set of their first characters while the
  -- position is within its bound, then the longest shorter prefix's ranked set, best first.
  local from = pos
  local bound = deep and has[#list + 1]
  if bound and (from == '' or lt(from, bound)) then
    local done = walk(base .. ':' .. names[#list + 1], from)
    -- A bound of '\255' means the deep set holds every term of its prefix.
    if not done or bound == '\255' then
      from = nil
    else
      from = bound
    end
  end
  if from then
    for l = #list, 1, -1 do
      if has[l] and #list[l] < #q then
        walk(base .. ':' .. names[l], from)
        break
      end
    end
  end
end

local reply = { 0, '' }
if #rows > need then
  reply[1], reply[2] = 1, rows[need]
elseif stopped then
  reply[1], reply[2] = 1, stopped
end
local ids, kinds = {}, {}
for i = 1, math.min(#rows, need) do
  local m = rows[i]
  local j = find(m, '\0', 9, true)
  ids[i] = sub(m, j + 1)
  kinds[i] = j == 9 + #q and 1 or 2
end
if #ids > 0 then
  local values = redis.call('HMGET', data, unpack(ids))
  for i = 1, #ids do
    reply[#reply + 1] = ids[i]
    reply[#reply + 1] = values[i]
    reply[#reply + 1] = kinds[i]
  end
end
return reply
