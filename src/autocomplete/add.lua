-- Add: insert or update a batch of dictionary terms, atomically. Every entry is checked before
-- anything is written, so a rejected batch changes nothing.
--
-- KEYS[1] lex    sorted set, every score 0: the lex member "<key>\0<id>" of every term
-- KEYS[2] data   hash: id -> "<score>\0<display, '' when equal to id>\0<payload>"
-- KEYS[3] meta   hash: 'depth' = the longest prefix (in characters) that ever had a ranked set
-- KEYS[4] vocab  sorted set, every score 0: every word of every term
-- KEYS[5] heavy  hash: prefix -> 1 for every prefix that has a ranked set
-- ARGV[1] base: the dictionary's other keys, which share the hash tag of KEYS, are
--         <base>:r:<prefix>  ranked set of every term with that prefix, kept while the prefix
--                            has more than `heavy` terms (see remove.lua for when it goes)
--         <base>:w:<word>    lex members of the terms having that word
--         <base>:vg:<gram>   set of the vocabulary words containing that gram
-- ARGV[2] heavy: a prefix gets a ranked set once more than this many terms have it
-- ARGV[3] largest absolute score allowed
-- ARGV[4] max depth: only prefixes of at most this many characters get a ranked set (queries on
--         longer ones walk the longest shorter prefix's set, or rank the few terms they have)
-- ARGV[5..] per entry: id, key, display ('' when equal to id), score op ('' keep, 's' set,
--           'i' add), score, payload ('' keep, or 'p' .. payload), word count, the words
--
-- Returns {0, added, updated, term count, score of each entry (as text)...}, or {1, entry number}
-- when an entry's resulting score would be out of range.
local lex, data, meta, vocab, heavy_set = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local base, heavy, max_score = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local max_depth = tonumber(ARGV[4])

-- The entries, parsed once.
local entries = {}
local at = 5
while at <= #ARGV do
  local e = {
    id = ARGV[at],
    key = ARGV[at + 1],
    display = ARGV[at + 2],
    op = ARGV[at + 3],
    value = tonumber(ARGV[at + 4]),
    payload = ARGV[at + 5],
    words = {},
  }
  local n = tonumber(ARGV[at + 6])
  for w = 1, n do
    e.words[w] = ARGV[at + 6 + w]
  end
  entries[#entries + 1] = e
  at = at + 7 + n
end

-- Pass 1: the score every entry ends with; reject the whole batch on one out of range.
local pending = {}
for i, e in ipairs(entries) do
  local score = pending[e.id]
  if score == nil then
    e.old = redis.call('HGET', data, e.id)
    score = e.old and parse_value(e.old) or 0
  end
  if e.op == 's' then
    score = e.value
  elseif e.op == 'i' then
    score = score + e.value
  end
  if not (score >= -max_score and score <= max_score) then
    return { 1, i }
  end
  pending[e.id] = score
end

-- Copies every term with prefix p into its new ranked set rk.
local function materialize(rk, p, whole)
  local members
  if whole then
    members = redis.call('ZRANGE', lex, 0, -1)
  else
    members = redis.call('ZRANGE', lex, '[' .. p, '(' .. p .. '\255', 'BYLEX')
  end
  local ids = {}
  for i = 1, #members do
    local m = members[i]
    ids[i] = string.sub(m, string.find(m, '\0', 1, true) + 1)
  end
  local values = redis.call('HMGET', data, unpack(ids))
  local args = {}
  for i = 1, #members do
    args[#args + 1] = 0
    args[#args + 1] = rank_bytes((parse_value(values[i]))) .. members[i]
  end
  redis.call('ZADD', rk, unpack(args))
  redis.call('HSET', heavy_set, p, 1)
end

-- The prefixes of key (the empty one first) up to `upto` characters, and which of them have a
-- ranked set.
local function prefixes(key, upto)
  local list = { '' }
  local n = 0
  for i = 2, #key + 1 do
    local b = string.byte(key, i)
    if b == nil or b < 128 or b >= 192 then
      n = n + 1
      if n > upto then
        break
      end
      list[#list + 1] = string.sub(key, 1, i - 1)
    end
  end
  return list, redis.call('HMGET', heavy_set, unpack(list))
end

local depth = tonumber(redis.call('HGET', meta, 'depth') or '-1')
local added, updated, scores = 0, 0, {}
for _, e in ipairs(entries) do
  local id, key, payload = e.id, e.key, e.payload
  local member = key .. '\0' .. id
  -- The value before this entry: read in pass 1, unless an earlier entry of the batch wrote it.
  local old = e.old
  if pending[id] == nil then
    old = redis.call('HGET', data, id)
  end
  pending[id] = nil
  local score, old_score = 0, nil
  if old then
    local parsed, _, old_payload = parse_value(old)
    old_score, score = parsed, parsed
    if payload == '' then
      payload = old_payload
    else
      payload = string.sub(payload, 2)
    end
  elseif payload ~= '' then
    payload = string.sub(payload, 2)
  end
  if e.op == 's' then
    score = e.value
  elseif e.op == 'i' then
    score = score + e.value
  end
  if score == 0 then
    score = 0
  end
  redis.call('HSET', data, id, score_text(score) .. '\0' .. e.display .. '\0' .. payload)

  if old then
    updated = updated + 1
    if score ~= old_score then
      -- Move the term within every ranked set it is in (a ranked set holds every term with
      -- its prefix, so the old member is there exactly when the set exists).
      local old_ranked, new_ranked = rank_bytes(old_score) .. member, rank_bytes(score) .. member
      local list, has = prefixes(key, depth)
      for l = 1, #list do
        if has[l] then
          local rk = base .. ':r:' .. list[l]
          redis.call('ZREM', rk, old_ranked)
          redis.call('ZADD', rk, 0, new_ranked)
        end
      end
    end
  else
    added = added + 1
    redis.call('ZADD', lex, 0, member)
    for _, word in ipairs(e.words) do
      local wk = base .. ':w:' .. word
      redis.call('ZADD', wk, 0, member)
      if redis.call('ZCARD', wk) == 1 then
        -- A new word: into the vocabulary and its gram sets.
        redis.call('ZADD', vocab, 0, word)
        local grams = grams_of(utf8_chars(word))
        for g = 1, #grams do
          redis.call('SADD', base .. ':vg:' .. grams[g], word)
        end
      end
    end
    -- Ranked sets: join those of the term's prefixes; create one for a prefix that just passed
    -- `heavy` terms. Once a prefix has at most `heavy` terms, longer ones do too and need no
    -- count, but a ranked set may still exist for them up to `depth`.
    local ranked = rank_bytes(score) .. member
    local list, has = prefixes(key, math.min(depth + 1, max_depth))
    local counting = true
    local l = 1
    while l <= #list do
      local p = list[l]
      local rk = base .. ':r:' .. p
      if has[l] then
        redis.call('ZADD', rk, 0, ranked)
      elseif counting then
        local count
        if l == 1 then
          count = redis.call('ZCARD', lex)
        else
          count = redis.call('ZLEXCOUNT', lex, '[' .. p, '(' .. p .. '\255')
        end
        if count > heavy then
          materialize(rk, p, l == 1)
          if l - 1 > depth then
            -- A new deepest ranked prefix: the next one may need counting too.
            depth = l - 1
            redis.call('HSET', meta, 'depth', depth)
            local longer = prefixes(key, math.min(depth + 1, max_depth))
            if #longer > #list then
              list[#list + 1] = longer[#longer]
            end
          end
        else
          counting = false
        end
      end
      l = l + 1
    end
  end
  scores[#scores + 1] = score_text(score)
end

local reply = { 0, added, updated, redis.call('ZCARD', lex) }
for i = 1, #scores do
  reply[#reply + 1] = scores[i]
end
return reply
