-- Helpers shared by the dictionary scripts (prepended to add.lua, remove.lua, complete.lua and
-- ranked.lua).
--
-- A dictionary term is stored as the "lex member" "<key>\0<id>": <key> is its matching form
-- (NFKC with full case folding, computed by Baton), <id> its display text in NFC. It is in the
-- lex set of the first byte of <key> (lex_name), so the lex sets, one after the other in byte
-- order, hold every term in lexicographic order. A ranked set stores "<rank><key>\0<id>", where
-- <rank> is 8 bytes that sort (as Redis compares members, byte by byte) by descending score, so
-- ZRANGE ... BYLEX walks it best first. These scripts compare strings with lt (below), not with
-- Lua's < alone, which follows the server's locale (strcoll).

-- Library functions the loops below call most, as locals (a global is a table lookup).
local sub, byte, find, format = string.sub, string.byte, string.find, string.format

-- Lua compares strings with the server's locale (strcoll). In the C locale, as Redis usually
-- runs, that is byte order, the order Redis keeps sorted sets in; otherwise compare byte by byte.
local BYTEWISE = ('Z' < 'a') and ('Z' < '_') and ('_' < 'a') and not ('a' < 'B')
  and ('a' < 'a\0') and ('a\0b' < 'a\0c') and ('\127' < '\128') and ('\194\191' < '\195\128')

-- Whether a sorts before b in byte order.
local function lt(a, b)
  if BYTEWISE then
    return a < b
  end
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

-- Sorts a list of strings in byte order, in place: by Lua's own comparison, with no Lua function
-- per comparison, when the locale compares bytes.
local function sort_bytes(list)
  if BYTEWISE then
    table.sort(list)
  else
    table.sort(list, lt)
  end
end

-- The 8-byte rank of a score: IEEE 754 big-endian bits, mapped to descending byte order.
-- Remembered per score for the rest of the call (many terms share a score).
local RANKS = {}
local function rank_bytes(score)
  if score == 0 then score = 0 end -- -0 ranks as 0
  local r = RANKS[score]
  if r then
    return r
  end
  r = struct.pack('>d', score)
  if score >= 0 then
    local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(r, 1, 8)
    r = string.char(bit.bxor(b1, 0x7F), bit.bxor(b2, 0xFF), bit.bxor(b3, 0xFF), bit.bxor(b4, 0xFF),
      bit.bxor(b5, 0xFF), bit.bxor(b6, 0xFF), bit.bxor(b7, 0xFF), bit.bxor(b8, 0xFF))
  end
  RANKS[score] = r
  return r
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

-- The prefixes of a matching form that can have a ranked set, shortest first: its first byte,
-- then its first 1 to `depth` characters (the first character only when it is longer than a
-- byte). Each is a prefix of the next, which it is the parent of.
local function ranked_prefixes(key, depth)
  local list = { sub(key, 1, 1) }
  local n = 0
  for i = 2, #key + 1 do
    local b = byte(key, i)
    if b == nil or b < 128 or b >= 192 then
      n = n + 1
      if i > 2 then
        list[#list + 1] = sub(key, 1, i - 1)
      end
      if n >= depth then
        break
      end
    end
  end
  return list
end

-- The id (display text) of a lex member "<key>\0<id>" (or of a ranked member, which ends so).
local function id_of(member)
  return sub(member, find(member, '\0', 1, true) + 1)
end

-- The first n characters of key, or nil when it has fewer.
local function first_chars(key, n)
  local count = 0
  for i = 2, #key + 1 do
    local b = byte(key, i)
    if b == nil or b < 128 or b >= 192 then
      count = count + 1
      if count == n then
        return sub(key, 1, i - 1)
      end
    end
  end
  return nil
end

-- The name of the ranked set of prefix p: its key is <base>:<name>, and its field in the heavy
-- hash. A first byte's is 'b:' and the byte in hex (a lone byte of a multi-byte character is
-- not text), a character prefix's 'r:' and the prefix.
local BYTE_NAMES, LEX_NAMES = {}, {}
local function set_name(p)
  if #p == 1 then
    local name = BYTE_NAMES[p]
    if name == nil then
      name = format('b:%02x', byte(p))
      BYTE_NAMES[p] = name
    end
    return name
  end
  return 'r:' .. p
end

-- The name of the lex set of the terms whose matching form starts with the byte b starts with:
-- its key is <base>:<name>, and its field in the heavy hash. 'l:' and the byte in hex.
local function lex_name(b)
  local first = byte(b)
  local name = LEX_NAMES[first]
  if name == nil then
    name = format('l:%02x', first)
    LEX_NAMES[first] = name
  end
  return name
end

-- The names of every lex set there can be, in byte order (a matching form starts with an ASCII
-- byte or the first byte of a multi-byte character), with their bytes.
local function all_lex_names()
  local names, bytes = {}, {}
  for b = 1, 244 do
    if b < 128 or b >= 194 then
      names[#names + 1] = lex_name(string.char(b))
      bytes[#bytes + 1] = b
    end
  end
  return names, bytes
end

-- A score as text that reads back to the same double.
local function score_text(score)
  return string.format('%.17g', score)
end

-- The parts of a data hash value "<score>\0<display or ''>\0<payload>".
local function parse_value(v)
  local a = find(v, '\0', 1, true)
  local b = find(v, '\0', a + 1, true)
  return tonumber(sub(v, 1, a - 1)), sub(v, a + 1, b - 1), sub(v, b + 1)
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
