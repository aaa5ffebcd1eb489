-- Ranking: how terms entering the ranked sets, or moving in them, change those sets (prepended,
-- after write.lua, to add.lua and change.lua). One algorithm serves an `Add` step (terms added,
-- or whose score changed) and a step of a RANKED build (the next terms in lexicographic order,
-- added to the ranked sets as new ones).
--
-- The ranked sets are those of a dictionary `D`: the whole dictionary once RANKED is served;
-- while it is being built, the terms whose lex member sorts at or before the build's cursor
-- (`limit` below). Every count that decides a threshold (`D` passing `heavy` terms, a prefix
-- passing `heavy`) and every copy into a set being created reads only that part of the lex
-- sets, so that the sets are at every moment exactly what writes to a dictionary holding `D`
-- alone would have made of them; terms after the cursor are left to the build. The invariants
-- readers rely on follow for `D` (docs/autocomplete.md, "How each query stays bounded"):
--   - once `h` has '' (D passed `heavy` terms), every first-byte set b:XX holds every term of
--     D starting with byte XX, and `top` every term of D ranked at or before its last member;
--   - a prefix's set r:P listed in `h` holds every term of D starting with P;
--   - a deep set t:P listed in `h` holds every term of D starting with P ranked at or before
--     its bound (the field's value; '\255' for every one).
-- When the build's cursor passes the last lex set, D is the whole dictionary.
--
-- ranked_writer(o) takes
--   o.base, o.data, o.heavy_set, o.top   the dictionary's key base and keys (as in add.lua)
--   o.heavy, o.max_depth, o.top_size, o.deep_size   (add.lua's ARGV[2], [4], [5], [6])
--   o.wide     whether every lex set and first-byte ranked set is declared
--   o.room, o.single   the work the step may do beyond its entries' own, and whether it has one
--              entry (add.lua's ARGV[11] says what a step of one entry may do beyond it)
--   o.limit    nil, or the lex member D ends at: counts read the lex sets up to it, and the
--              terms passed as new are added to them
--   o.copy_limit   the same for copies made after the step's lex members are written (add.lua:
--              the same as limit; a build step: its last term, its terms being in the lex sets)
--   o.new_lex  lex set name -> true for the lex sets the step creates
-- and returns W with
--   W.term(key, member, score, old_score, entry)  a term of D entering it (old_score nil) or
--                         moving, brought by the step's entry `entry` (1-based, in step order)
--   W.fields(fields)      appends the fields of `h` the plan needs ('' first is the caller's)
--   W.plan(has, count)    reads what the writes need, `has` holding those fields and `count`
--                         the size of D once the step's terms are in; nil when the step can go
--                         on, 2 when it needs every first-byte set declared, 3 and `fits` when
--                         it would do more work than it may: its first `fits` entries would not
--                         (they touch none of the sets it cannot afford, or leave the prefix of
--                         one it cannot create at most `heavy` terms), and the next one brings
--                         that work
--   W.apply(mark)         writes, after the step's lex members and data; `mark(name, value)`
--                         notes a field of `h` to set
local function ranked_writer(o)
  local base, data, heavy_set, top = o.base, o.data, o.heavy_set, o.top
  local heavy, max_depth, top_size, deep_size = o.heavy, o.max_depth, o.top_size, o.deep_size
  local limit, copy_limit = o.limit, o.copy_limit
  local single, room = o.single, o.room
  -- The most members one cut-back removes from a deep set or top.
  local cut_most = math.floor(deep_size / 2)
  local W = {}
  local levels, groups, moves, deeps, deep_order = {}, {}, {}, {}, {}
  local has, created, extra, first_bytes = nil, {}, 0, nil
  local last_top, top_joins, top_leaves, top_card = nil, {}, {}, nil
  -- The first entry of the step that brings work the step cannot afford (plan).
  local over = nil
  local function over_at(entry)
    if over == nil or entry < over then
      over = entry
    end
  end

  -- The upper end of prefix p's range in its lex set, within `lim`.
  local function upto(lim, p)
    local hi = p .. '\255'
    if lim and lt(lim, hi) then
      return '[' .. lim
    end
    return '(' .. hi
  end

  function W.term(key, member, score, old_score, entry)
    local new_ranked = rank_bytes(score) .. member
    local old_ranked = old_score and (rank_bytes(old_score) .. member)
    moves[#moves + 1] = { new_ranked, old_ranked, entry }
    local list = ranked_prefixes(key, max_depth)
    for l = 1, #list do
      local p = list[l]
      local g = groups[p]
      if g == nil then
        g = { prefix = p, name = set_name(p), parent = list[l - 1], adds = {}, removes = {},
          new = 0, entry = entry, entries = {} }
        g.key = declared(base, g.name)
        groups[p] = g
        levels[l] = levels[l] or {}
        levels[l][#levels[l] + 1] = g
      end
      g.adds[#g.adds + 1] = '0'
      g.adds[#g.adds + 1] = new_ranked
      if old_ranked then
        g.removes[#g.removes + 1] = old_ranked
      else
        g.new = g.new + 1
        g.entries[g.new] = entry
      end
    end
    local p = first_chars(key, max_depth + 1)
    if p then
      local d = deeps[p]
      if d == nil then
        d = { prefix = p, name = 't:' .. p, parent = list[#list], adds = {}, removes = {}, new = 0,
          entry = entry, entries = {} }
        d.key = declared(base, d.name)
        deeps[p] = d
        deep_order[#deep_order + 1] = d
      end
      d.adds[#d.adds + 1] = new_ranked
      if old_ranked then
        d.removes[#d.removes + 1] = old_ranked
      else
        d.new = d.new + 1
        d.entries[d.new] = entry
      end
    end
  end

  function W.fields(fields)
    for _, level in ipairs(levels) do
      for _, g in ipairs(level) do
        fields[#fields + 1] = g.name
      end
    end
    for _, d in ipairs(deep_order) do
      fields[#fields + 1] = d.name
    end
  end

  -- What a step of one entry may do beyond its room: make D ranked (4 units a term, at most
  -- heavy + 1 terms, and a field per possible lex set). Its other creations leave room for two
  -- cut-backs.
  local allowance = 4 * (heavy + 1) + FIRST_BYTES
  local reserve = 2 * (cut_most + 1)
  -- Counts `cost` units of work beyond the entries' own; false when the step cannot afford it.
  -- A cost that must be paid (`must`) is refused only to a step of more than one entry; an
  -- optional one (a set's creation) in a step of one entry leaves room for two cut-backs.
  local function afford(cost, must)
    local fits
    if not single then
      fits = extra + cost <= room
    else
      fits = must or extra + cost + reserve <= room + allowance
    end
    if fits then
      extra = extra + cost
    end
    return fits
  end

  -- The entry of the step whose term takes group g's prefix (of n terms with the step's) past
  -- `heavy` terms: the entries before it leave the prefix at most `heavy` terms, with no set to
  -- create. Its first entry when the prefix had passed `heavy` before the step.
  local function crossing(g, n)
    return g.entries[heavy - (n - g.new) + 1] or g.entry
  end

  -- The terms of D with prefix p once the step's new ones are in.
  local function prefix_count(p, new)
    work = work + 1
    return redis.call('ZLEXCOUNT', declared(base, lex_name(p)), '[' .. p, upto(limit, p)) + new
  end

  function W.plan(h, count)
    has = h
    if #moves == 0 then
      return nil
    end
    local ranks = levels[1] and not has[''] and count > heavy
    local too_much = false
    if ranks then
      if not o.wide then
        return 2
      end
      -- Every lex set there is (or this step creates) is copied into its first byte's ranked
      -- set, and into the top set: 4 units a term of D (count).
      local lex_names, ranked_names = all_first_byte_names()
      if not afford(4 * count + #lex_names, true) then
        -- The entries before the one whose term takes D past `heavy` terms fit.
        local new_entries = {}
        for _, move in ipairs(moves) do
          if not move[2] then
            new_entries[#new_entries + 1] = move[3]
          end
        end
        local past = new_entries[heavy - (count - #new_entries) + 1] or moves[1][3]
        return 3, past - 1
      end
      local exists = redis.call('HMGET', heavy_set, unpack(lex_names))
      work = work + #lex_names
      first_bytes = {}
      for i, name in ipairs(lex_names) do
        if exists[i] or o.new_lex[name] then
          first_bytes[#first_bytes + 1] = { lex = declared(base, name), ranked = ranked_names[i],
            byte = string.char(tonumber(string.sub(name, 3), 16)) }
          declared(base, ranked_names[i])
        end
      end
      for _, g in ipairs(levels[1]) do
        created[g.prefix] = true
      end
    end
    for l, level in ipairs(levels) do
      for _, g in ipairs(level) do
        if l > 1 and not has[g.name] and (has[groups[g.parent].name] or created[g.parent]) then
          -- Without a set, the prefix had at most `heavy` terms (its parent has a set, else the
          -- parent had at most `heavy` terms and so had the prefix): it may pass it now.
          local n = prefix_count(g.prefix, g.new)
          if n > heavy then
            if afford(3 * n) then
              g.create, created[g.prefix] = true, true
            else
              too_much = true
              over_at(crossing(g, n))
            end
          end
        end
      end
    end
    for _, d in ipairs(deep_order) do
      if not has[d.name] and (has[groups[d.parent].name] or created[d.parent]) then
        local n = prefix_count(d.prefix, d.new)
        if n > heavy then
          -- (Created with more than twice `deep` members, it is cut back at once.)
          if afford(3 * n + cut_most + 1) then
            d.create = true
          else
            too_much = true
            over_at(crossing(d, n))
          end
        end
      elseif has[d.name] then
        -- The terms that join the deep set (ranked before its bound) and leave it; a set that
        -- would pass twice `deep` members is cut back, at most `cut_most` of them.
        local bound = has[d.name]
        d.joins, d.leaves = {}, {}
        for _, r in ipairs(d.removes) do
          if not lt(bound, r) then
            d.leaves[#d.leaves + 1] = r
          end
        end
        for _, r in ipairs(d.adds) do
          if lt(r, bound) then
            d.joins[#d.joins + 1] = '0'
            d.joins[#d.joins + 1] = r
          end
        end
        if #d.joins > 0 then
          d.card = redis.call('ZCARD', d.key)
          work = work + 1
          if d.card + #d.joins / 2 > 2 * deep_size and not afford(cut_most + 1, true) then
            too_much = true
            over_at(d.entry)
          end
        end
      end
    end
    -- The same for the top set.
    last_top = has[''] and redis.call('ZRANGE', top, -1, -1)[1]
    if last_top then
      work = work + 1
      local first_join
      for _, move in ipairs(moves) do
        if move[2] and not lt(last_top, move[2]) then
          top_leaves[#top_leaves + 1] = move[2]
        end
        if lt(move[1], last_top) then
          top_joins[#top_joins + 1] = '0'
          top_joins[#top_joins + 1] = move[1]
          first_join = first_join or move[3]
        end
      end
      if #top_joins > 0 then
        top_card = redis.call('ZCARD', top)
        work = work + 1
        if top_card + #top_joins / 2 > 2 * top_size and not afford(cut_most + 1, true) then
          too_much = true
          over_at(first_join)
        end
      end
    end
    if too_much and not single then
      return 3, over - 1
    end
    return nil
  end

  -- Copies the lex members `members` into ranked set `key` (and the top set when `and_top`),
  -- with the scores in data.
  local function copy_ranked(members, key, and_top)
    if #members == 0 then
      return
    end
    local ids = {}
    work = work + #members
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
    if and_top then
      batched('ZADD', top, ranked, 2)
    end
  end

  -- The lex members of D with prefix p (the step's terms included).
  local function prefix_members(p)
    return redis.call('ZRANGE', declared(base, lex_name(p)), '[' .. p, upto(copy_limit, p),
      'BYLEX')
  end

  -- Cuts the partial ranked set `key` of `size` members, which holds every term ranked at or
  -- before its last member, back towards `keep` members: its last members go, at most
  -- `cut_most` of them, so that a cut-back is no more work than its step can afford. Returns its
  -- new last member.
  local function cut_back(key, size, keep)
    local n = math.min(size - keep, cut_most)
    redis.call('ZREMRANGEBYRANK', key, -n, -1)
    work = work + n + 1
    return redis.call('ZRANGE', key, -1, -1)[1]
  end

  function W.apply(mark)
    if #moves == 0 then
      return
    end
    if first_bytes then
      -- D just passed `heavy` terms (it has at most `heavy` + a step): every term of D into the
      -- ranked set of its first byte, lex set by lex set, and into the top set.
      for _, f in ipairs(first_bytes) do
        local members
        if copy_limit then
          members = redis.call('ZRANGE', f.lex, '-', upto(copy_limit, f.byte), 'BYLEX')
        else
          members = redis.call('ZRANGE', f.lex, 0, -1)
        end
        copy_ranked(members, base .. ':' .. f.ranked, true)
        mark(f.ranked)
      end
      mark('')
    end

    -- Deep sets: every term of their prefix ranked at or before their bound. One is created
    -- (with every term of its prefix, usually `heavy` + a step) when its prefix passes `heavy`
    -- terms.
    for _, d in ipairs(deep_order) do
      if d.joins then
        local size
        if #d.joins > 0 then
          size = d.card + batched('ZADD', d.key, d.joins, 2)
        end
        if #d.leaves > 0 then
          local removed = batched('ZREM', d.key, d.leaves, 1)
          size = size and size - removed
        end
        if size and size > 2 * deep_size then
          mark(d.name, cut_back(d.key, size, deep_size))
        end
      elseif d.create then
        local members = prefix_members(d.prefix)
        copy_ranked(members, d.key)
        if #members > 2 * deep_size then
          mark(d.name, cut_back(d.key, #members, deep_size))
        else
          mark(d.name, '\255')
        end
      end
    end

    if last_top then
      -- The top set holds every term ranked at or before its last member: a term joins it when
      -- ranked before that, leaves it when it goes or moves past it.
      if #top_joins > 0 then
        local size = top_card + batched('ZADD', top, top_joins, 2)
        if #top_leaves > 0 then
          size = size - batched('ZREM', top, top_leaves, 1)
        end
        if size > 2 * top_size then
          cut_back(top, size, top_size)
        end
      elseif #top_leaves > 0 then
        batched('ZREM', top, top_leaves, 1)
      end
    end

    for l, level in ipairs(levels) do
      for _, g in ipairs(level) do
        if created[g.prefix] and (l == 1 or g.create) then
          if g.create then
            copy_ranked(prefix_members(g.prefix), g.key)
            mark(g.name)
          end
          -- (A first byte's set was copied whole above.)
        elseif has[g.name] or (l == 1 and has['']) then
          -- (A first byte without a set while D is ranked: only new terms have it.)
          -- New members first: removing old ones first could empty the set, and a Cluster
          -- refuses a command on a key the script deleted while the slot migrates.
          batched('ZADD', g.key, g.adds, 2)
          if #g.removes > 0 then
            batched('ZREM', g.key, g.removes, 1)
          end
          mark(g.name)
        end
      end
    end
  end

  return W
end

-- The fields of `h` a step sets: `mark(name, value)` notes field `name` with `value` ('1' when
-- nil) unless `has` (the fields read, updated here) shows it set and no value is given; `marks`
-- lists the fields and values noted, for one HSET.
local function marker(has)
  local marks = {}
  local function mark(name, value)
    if not has[name] or value then
      has[name] = value or '1'
      marks[#marks + 1] = name
      marks[#marks + 1] = value or '1'
    end
  end
  return mark, marks
end
