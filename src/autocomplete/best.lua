-- Best-first reading of the terms of one prefix by score (prepended, after rank.lua, to
-- ranked.lua and fuzzy.lua): the one algorithm that reads the ranked sets add.lua keeps
-- (ranking.lua) for a prefix.
--
-- best_of(base, lex, data, heavy_set, q, need, pos, depth, heavy, budget, keep) returns
--   rows    up to need + 1 ranked members (rank bytes, then the lex member) of the terms starting
--           with q, after `pos` (exclusive; '' for the start), that `keep(m)` accepts (nil: all),
--           best first;
--   stopped where to go on from when the budget ran out before that many were found, else nil;
--   spent   the index entries read (at most `budget`, besides a range of at most `heavy` terms
--           ranked here) and
--   calls   the reads of index sets made.
-- lex is q's lex set, data the data hash, heavy_set the heavy hash (add.lua says what they hold).
--
-- The rows come from q's own ranked set when it has one; else, when q has at most `heavy`
-- terms, from its range of the lex set, ranked here; else (a prefix longer than `depth`) from
-- the deep set of its first `depth` + 1 characters while the position is within its bound, then
-- from the ranked set of its longest prefix that has one, walked best first checking each term.
local function best_of(base, lex, data, heavy_set, q, need, pos, depth, heavy, budget, keep)
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
  local calls, left = 1, budget
  local rows, stopped = {}, nil

  -- Walks src best first from `from` (exclusive; '' for the start), keeping the entries with
  -- prefix q that `keep` accepts, until a page and one more are found, src runs out (returns
  -- true), or the budget does (sets `stopped`).
  local function walk(src, from)
    local cur, last, grow = from ~= '' and '(' .. from or '-', nil, need + 1
    while #rows <= need do
      if left <= 0 then
        stopped = last or from
        return false
      end
      local chunk = math.min(left, grow)
      grow = math.min(math.max(grow * 2, 64), 1024)
      calls = calls + 1
      local batch = redis.call('ZRANGE', src, cur, '+', 'BYLEX', 'LIMIT', 0, chunk)
      left = left - #batch
      for _, m in ipairs(batch) do
        last = m
        if find(m, q, 9, true) == 9 and (keep == nil or keep(m)) then
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

  local own = list[#list] == q and has[#list]
  calls = calls + 1
  if own and keep == nil then
    -- Its own set: every entry is a result.
    rows = redis.call('ZRANGE', base .. ':' .. names[#list], pos ~= '' and '(' .. pos or '-', '+',
      'BYLEX', 'LIMIT', 0, need + 1)
    left = left - #rows
  elseif own then
    walk(base .. ':' .. names[#list], pos)
  elseif redis.call('ZLEXCOUNT', lex, '[' .. q, '(' .. q .. '\255') <= heavy then
    -- Few terms: rank them here.
    calls = calls + 1
    local members = redis.call('ZRANGE', lex, '[' .. q, '(' .. q .. '\255', 'BYLEX')
    if #members > 0 then
      local ids = {}
      for i, m in ipairs(members) do
        ids[i] = id_of(m)
      end
      calls = calls + 1
      local values = redis.call('HMGET', data, unpack(ids))
      local ranked = {}
      for i, m in ipairs(members) do
        local r = rank_bytes((parse_value(values[i]))) .. m
        if (pos == '' or lt(pos, r)) and (keep == nil or keep(r)) then
          ranked[#ranked + 1] = r
        end
      end
      sort_bytes(ranked)
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
  return rows, stopped, budget - left, calls
end
