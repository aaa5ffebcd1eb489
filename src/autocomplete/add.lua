-- Add: one step of a batch of dictionary terms: a few entries, in batch order, applied
-- atomically. Baton cuts a batch into steps small enough for each call to hold Redis for a few
-- milliseconds at most, and sends them one after the other. Every entry of the step is checked
-- and every key it needs is looked up before anything is written, so a step that refuses
-- (answers other than 0 below) changes nothing. The work of the step is grouped by key: one
-- command per key (in chunks of CHUNK arguments), however many entries touch it.
--
-- KEYS[1] data   hash: id -> "<score>\0<display, '' when equal to id>\0<payload>"; its length
--                is the number of terms
-- KEYS[2] vocab  sorted set, every score 0: every word of every term
-- KEYS[3] heavy  hash: set name -> 1 for every lex set (lex_name) and ranked set (set_name)
--                there is, or its bound for a deep set ('t:' .. prefix); '' -> 1 while the
--                first-byte ranked sets exist (the dictionary is ranked)
-- KEYS[4] top    (below)
-- KEYS[5] features hash (features.lua): the step writes only the indexes of the dictionary's
--                features, read here, so a step never races a change of them; while RANKED is
--                built, the ranked sets of the terms at or before the build's cursor only, and
--                their count `n` (ranking.lua)
-- KEYS[6] record list: the batch's fingerprint, then one item per entry applied so far, in
--                batch order ('a' or 'u' for added or updated, then the score after it); only
--                when ARGV[8] is not ''
-- KEYS[..] every other key the step may touch (whatever the features) (`declared`): those of the entries' lex sets,
--          words, grams of words, ranked and deep sets, and with ARGV[7] every lex set and
--          first-byte ranked set
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
--         (the ranked sets only with feature 'r', words and vocabulary with 'w', grams with 's')
-- ARGV[2] heavy: a prefix (or the dictionary) gets ranked sets once it has more terms than this
-- ARGV[3] largest absolute score allowed
-- ARGV[4] max depth: only prefixes of at most this many characters get a ranked set
-- ARGV[5] top: the size the top set is cut back to
-- ARGV[6] deep: the size a deep set is cut back to
-- ARGV[7] '1' when every lex set and first-byte ranked set is declared, else ''
-- ARGV[8] the batch's fingerprint when it is recorded (KEYS[6]), else ''
-- ARGV[9] the batch position of the step's first entry (0 for the first)
-- ARGV[10] how long the record is kept after its last step (ms)
-- ARGV[11] room: the work (write.lua's units) the step may do beyond its entries' own (which
--          Baton counted when it cut the step): copying terms into the ranked sets it creates (4
--          units a term for a first-byte set and top, 3 for another) and cutting back deep sets
--          and top (at most `deep` / 2 members a set and step, so that no step removes many).
--          A step of more than one entry that would pass it changes nothing and answers {3}; a
--          step of one entry makes the dictionary ranked and cuts back whatever it costs (at
--          most 4 * (heavy + 1) + 178) and 2 cut-backs, and creates a prefix's ranked or deep
--          set only within room + 4 * (heavy + 1) + 178 less 2 cut-backs: a set it cannot afford is created by a later step
--          of its prefix (readers walk the parent's set meanwhile, as for any prefix without one).
-- ARGV[12] the features Baton planned the step for (letters, features.lua): it declared the keys
--          of those only, and sends the words of the entries only with 'w'
-- ARGV[13..] per entry: id, key, display ('' when equal to id), score op ('' keep, 's' set,
--           'i' add), score, payload ('' keep, or 'p' .. payload), word count, the words.
--
-- Returns
--   {0, term count, work done (units as in ARGV[11]), its Redis time in microseconds (elapsed),
--   the features a write needs and '+' while a change of them is under way (write_told), then per
--   entry of the step 'a' or 'u' (added or updated) and the score after it}: applied (entries the
--   record shows as applied already are not applied again: their recorded outcome is returned)
--   {1, entry}: the entry's (1-based in the step) resulting score would be out of range
--   {2}: the step would make the dictionary ranked: send it again with every first-byte set
--   {3, fits}: the step would do more work than ARGV[11] allows: its first `fits` entries would
--   not, and the entry after them brings that work (ranking.lua)
--   {4, n}: the record shows the batch's first n entries applied, fewer than the step's
--   position: send the entries from n on
--   {5}: the record belongs to another batch
--   {6, features}: the step needs the keys of features ARGV[12] lacks: plan it for these
--   (write_told)
local argv, call = ARGV, redis.call
local data, vocab, heavy_set, top = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local base, heavy, max_score = argv[1], tonumber(argv[2]), tonumber(argv[3])
local max_depth, top_size, deep_size = tonumber(argv[4]), tonumber(argv[5]), tonumber(argv[6])
local wide, fingerprint, first = argv[7] == '1', argv[8], tonumber(argv[9])
local record_ttl, room = argv[10], tonumber(argv[11])
local record = fingerprint ~= '' and KEYS[6]
local fstate = write_state(KEYS[5])
-- While RANKED is built, the ranked sets hold only the terms at or before the build's cursor
-- (ranking.lua): the others are left to the build.
local building_r = fstate.building == 'r' and not has_feature(fstate.served, 'r')
local needs, told = write_needs(fstate), write_told(fstate)
if missing_feature(argv[12], needs) then
  return { 6, told }
end

-- The entries (their first argument's index).
local entries = {}
local at = 13
while at <= #argv do
  entries[#entries + 1] = at
  at = at + 7 + tonumber(argv[at + 6])
end

-- What the record says of this step: the outcome of its entries applied already.
local done_before, fresh = {}, false
if record then
  local n = call('LLEN', record)
  fresh = n == 0
  if fresh then
    if first > 0 then
      return { 4, 0 }
    end
  else
    if call('LINDEX', record, 0) ~= fingerprint then
      return { 5 }
    end
    if n - 1 < first then
      return { 4, n - 1 }
    end
    local skip = math.min(n - 1 - first, #entries)
    if skip > 0 then
      done_before = call('LRANGE', record, first + 1, first + skip)
      work = work + skip
    end
  end
end
local skip = #done_before

-- terms: one state per distinct id of the entries to apply, in order of first entry.
local terms, state = {}, {}
for e = skip + 1, #entries do
  local id = argv[entries[e]]
  if state[id] == nil then
    state[id] = { at = entries[e], entry = e }
    terms[#terms + 1] = id
  end
end
if #terms == 0 then
  local reply = { 0, call('HLEN', data), work, elapsed(), told }
  for i = 1, #done_before do
    reply[#reply + 1] = done_before[i]
  end
  return reply
end

-- Pass 1: the value every term ends with, and the score after each entry; refuse the step on one
-- out of range. An entry adds a term unless the term was there before it. Scores keep the text
-- they came in (Baton's, which reads back exactly) unless added to here.
local old = hash_values(data, terms)
local new_terms = 0
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
    new_terms = new_terms + 1
  end
end
local outcomes = {}
for e = skip + 1, #entries do
  local at = entries[e]
  local t = state[argv[at]]
  local how = 'u'
  if not t.there then
    how, t.there = 'a', true
  end
  local op, score, text = argv[at + 3], t.score, t.text
  if op == 's' then
    score, text = tonumber(argv[at + 4]), argv[at + 4]
  elseif op == 'i' then
    score, text = score + tonumber(argv[at + 4]), nil
  end
  if not (score >= -max_score and score <= max_score) then
    return { 1, e }
  end
  if score == 0 then
    score, text = 0, '0' -- not -0
  end
  t.score, t.text = score, text or score_text(score)
  t.display = argv[at + 2]
  if argv[at + 5] ~= '' then
    t.payload = sub(argv[at + 5], 2)
  end
  outcomes[#outcomes + 1] = how .. t.text
end

-- What to write, grouped by key: the data of every term; lex members and words of the new ones;
-- the ranked members of the terms that enter ranked sets (new) or move in them (score changed)
-- (ranking.lua).
local values, lex_order, lex_members = {}, {}, {}
local word_order, word_members = {}, {}
local ranked = ranked_writer({ base = base, data = data, heavy_set = heavy_set, top = top,
  heavy = heavy, max_depth = max_depth, top_size = top_size, deep_size = deep_size, wide = wide,
  room = room, single = #entries - skip == 1, limit = building_r and fstate.cursor or nil,
  copy_limit = building_r and fstate.cursor or nil, new_lex = lex_members })
-- Terms new to the ranked sets' dictionary (ranking.lua).
local new_ranked_terms = 0
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
    local first_word = t.at + 7
    local words_on = maintains(fstate, 'w', member)
    for w = first_word, words_on and first_word + tonumber(argv[t.at + 6]) - 1 or 0 do
      group(word_members, word_order, argv[w], '0')
      group(word_members, word_order, argv[w], member)
    end
  end
  if maintains(fstate, 'r', member) and (not t.old or t.score ~= t.old_score) then
    ranked.term(key, member, t.score, t.old and t.old_score, t.entry)
    if not t.old then
      new_ranked_terms = new_ranked_terms + 1
    end
  end
end
-- The key of lex set `name`.
local lex_keys = {}
local function lex_key(name)
  local k = lex_keys[name]
  if k == nil then
    k = declared(base, name)
    lex_keys[name] = k
  end
  return k
end
for _, name in ipairs(lex_order) do
  lex_key(name)
end
local word_keys = {}
for _, word in ipairs(word_order) do
  word_keys[word] = declared(base, 'w:' .. word)
end

-- The words new to the vocabulary, and the sets of their grams.
local new_words, gram_order, gram_words = {}, {}, {}
for first_word = 1, #word_order, CHUNK do
  local last = math.min(first_word + CHUNK - 1, #word_order)
  local known = call('ZMSCORE', vocab, unpack(word_order, first_word, last))
  work = work + last - first_word + 1
  for i = first_word, last do
    if not known[i - first_word + 1] then
      local word = word_order[i]
      new_words[#new_words + 1] = '0'
      new_words[#new_words + 1] = word
      if maintains(fstate, 's', word) then
        local grams = grams_of(utf8_chars(word))
        for g = 1, #grams do
          group(gram_words, gram_order, grams[g], word)
        end
      end
    end
  end
end
local gram_keys = {}
for _, gram in ipairs(gram_order) do
  gram_keys[gram] = declared(base, 'vg:' .. gram)
end

-- Which sets exist (lex sets, ranked sets: ranking.lua says which this step creates).
local fields = { '' }
for _, name in ipairs(lex_order) do
  fields[#fields + 1] = name
end
ranked.fields(fields)
local has = hash_values(heavy_set, fields)
local count = call('HLEN', data) + new_terms
-- The size of the ranked sets' dictionary once the step's terms are in.
local ranked_count = building_r and fstate.indexed + new_ranked_terms or count
local refused, fits = ranked.plan(has, ranked_count)
if refused then
  return { refused, fits }
end
check_declared()

-- Writes.
local mark, marks = marker(has)

batched('HSET', data, values, 2)
for _, name in ipairs(lex_order) do
  batched('ZADD', lex_keys[name], lex_members[name], 2)
  mark(name)
end
for _, word in ipairs(word_order) do
  batched('ZADD', word_keys[word], word_members[word], 2)
end
if #new_words > 0 then
  batched('ZADD', vocab, new_words, 2)
  for _, gram in ipairs(gram_order) do
    gram_batched('SADD', gram_keys[gram], gram_words[gram])
  end
end

ranked.apply(mark)
if building_r and new_ranked_terms > 0 then
  call('HSET', KEYS[5], 'n', ranked_count)
end
if #marks > 0 then
  batched('HSET', heavy_set, marks, 2)
end

local reply = { 0, count, work, elapsed(), told }
for i = 1, #done_before do
  reply[#reply + 1] = done_before[i]
end
for i = 1, #outcomes do
  reply[#reply + 1] = outcomes[i]
end
if record then
  if fresh then
    call('RPUSH', record, fingerprint)
  end
  batched('RPUSH', record, outcomes, 1)
  call('PEXPIRE', record, record_ttl)
end
return reply
