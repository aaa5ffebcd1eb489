-- Helpers shared by the dictionary scripts (prepended to add.lua, remove.lua and complete.lua).
--
-- A dictionary term is stored as the "lex member" "<key>\0<id>": <key> is its matching form
-- (NFKC with full case folding, computed by Baton), <id> its display text in NFC. A ranked set
-- stores "<rank><key>\0<id>", where <rank> is 8 bytes that sort (as Redis compares members, byte
-- by byte) by descending score, so ZRANGE ... BYLEX walks it best first. These scripts never
-- compare strings with < or >: Lua does that with the server's locale (strcoll), which need not
-- be byte order.

-- The 8-byte rank of a score: IEEE 754 big-endian bits, mapped to descending byte order.
local function rank_bytes(score)
  if score == 0 then score = 0 end -- -0 ranks as 0
  local b = struct.pack('>d', score)
  if score < 0 then
    return b
  end
  local t = { string.byte(b, 1, 8) }
  t[1] = bit.bxor(t[1], 0x7F)
  for i = 2, 8 do
    t[i] = bit.bxor(t[i], 0xFF)
  end
  return string.char(unpack(t))
end

-- The score encoded by rank_bytes (the first 8 bytes of r).
local function rank_score(r)
  local t = { string.byte(r, 1, 8) }
  if #t < 8 then
    return 0
  end
  if t[1] < 0x80 then
    t[1] = bit.bxor(t[1], 0x7F)
    for i = 2, 8 do
      t[i] = bit.bxor(t[i], 0xFF)
    end
  end
  return (struct.unpack('>d', string.char(unpack(t))))
end

-- A score as text that reads back to the same double.
local function score_text(score)
  return string.format('%.17g', score)
end

-- The parts of a data hash value "<score>\0<display or ''>\0<payload>".
local function parse_value(v)
  local a = string.find(v, '\0', 1, true)
  local b = string.find(v, '\0', a + 1, true)
  return tonumber(string.sub(v, 1, a - 1)), string.sub(v, a + 1, b - 1), string.sub(v, b + 1)
end

-- The characters of a UTF-8 string.
local function utf8_chars(s)
  local cs = {}
  for ch in string.gmatch(s, '[%z\1-\127\194-\244][\128-\191]*') do
    cs[#cs + 1] = ch
  end
  return cs
end

-- The grams of a vocabulary word (or of a query fragment): every 2- and 3-character sequence and
-- every non-ASCII character, each once.
local function grams_of(cs)
  local seen, list = {}, {}
  for i = 1, #cs do
    local c = cs[i]
    if #c > 1 and not seen[c] then
      seen[c] = true
      list[#list + 1] = c
    end
    if i + 1 <= #cs then
      local g = c .. cs[i + 1]
      if not seen[g] then
        seen[g] = true
        list[#list + 1] = g
      end
      if i + 2 <= #cs then
        g = g .. cs[i + 2]
        if not seen[g] then
          seen[g] = true
          list[#list + 1] = g
        end
      end
    end
  end
  return list
end
