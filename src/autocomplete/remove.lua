-- Remove: delete a batch of dictionary terms from every index, atomically. Unknown terms are
-- skipped. When the last term goes, no key of the dictionary is left.
--
-- KEYS[1] lex   KEYS[2] data   KEYS[3] meta   KEYS[4] vocab   KEYS[5] heavy   (as in add.lua)
-- ARGV[1] base (as in add.lua)
-- ARGV[2] low: a ranked set is dropped once its prefix has this many terms or fewer
-- ARGV[3..] per term: id, key, word count, the words
--
-- Returns {removed, term count}.
local lex, data, meta, vocab, heavy_set = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local base, low = ARGV[1], tonumber(ARGV[2])
local depth = tonumber(redis.call('HGET', meta, 'depth') or '-1')
local removed = 0
local at = 3
while at <= #ARGV do
  local id, key, n = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2])
  local old = redis.call('HGET', data, id)
  if old then
    removed = removed + 1
    local member = key .. '\0' .. id
    local ranked = rank_bytes((parse_value(old))) .. member
    redis.call('HDEL', data, id)
    redis.call('ZREM', lex, member)
    for w = 1, n do
      local word = ARGV[at + 2 + w]
      local wk = base .. ':w:' .. word
      redis.call('ZREM', wk, member)
      if redis.call('EXISTS', wk) == 0 then
        -- No term has the word any more.
        redis.call('ZREM', vocab, word)
        local grams = grams_of(utf8_chars(word))
        for g = 1, #grams do
          redis.call('SREM', base .. ':vg:' .. grams[g], word)
        end
      end
    end
    -- The ranked sets of the key's prefixes, up to the deepest one there is.
    local list = { '' }
    local n = 0
    for i = 2, #key + 1 do
      local b = string.byte(key, i)
      if b == nil or b < 128 or b >= 192 then
        n = n + 1
        if n > depth then
          break
        end
        list[#list + 1] = string.sub(key, 1, i - 1)
      end
    end
    local has = redis.call('HMGET', heavy_set, unpack(list))
    for l = 1, #list do
      if has[l] then
        local rk = base .. ':r:' .. list[l]
        redis.call('ZREM', rk, ranked)
        if redis.call('ZCARD', rk) <= low then
          redis.call('DEL', rk)
          redis.call('HDEL', heavy_set, list[l])
        end
      end
    end
  end
  at = at + 3 + n
end
local count = redis.call('ZCARD', lex)
if count == 0 then
  redis.call('DEL', meta)
end
return { removed, count }
