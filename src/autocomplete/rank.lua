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
-- byte, 1 to 127, or the first byte of a multi-byte character, 194 to 244), with their bytes.
-- Written out: building the 178 names each call took about 0.1 ms of every script that needs
-- them (a unit test checks the list against the keys Baton declares).
local function all_lex_names()
  return {
    'l:01', 'l:02', 'l:03', 'l:04', 'l:05', 'l:06', 'l:07', 'l:08', 'l:09', 'l:0a', 'l:0b', 'l:0c',
    'l:0d', 'l:0e', 'l:0f', 'l:10', 'l:11', 'l:12', 'l:13', 'l:14', 'l:15', 'l:16', 'l:17', 'l:18',
    'l:19', 'l:1a', 'l:1b', 'l:1c', 'l:1d', 'l:1e', 'l:1f', 'l:20', 'l:21', 'l:22', 'l:23', 'l:24',
    'l:25', 'l:26', 'l:27', 'l:28', 'l:29', 'l:2a', 'l:2b', 'l:2c', 'l:2d', 'l:2e', 'l:2f', 'l:30',
    'l:31', 'l:32', 'l:33', 'l:34', 'l:35', 'l:36', 'l:37', 'l:38', 'l:39', 'l:3a', 'l:3b', 'l:3c',
    'l:3d', 'l:3e', 'l:3f', 'l:40', 'l:41', 'l:42', 'l:43', 'l:44', 'l:45', 'l:46', 'l:47', 'l:48',
    'l:49', 'l:4a', 'l:4b', 'l:4c', 'l:4d', 'l:4e', 'l:4f', 'l:50', 'l:51', 'l:52', 'l:53', 'l:54',
    'l:55', 'l:56', 'l:57', 'l:58', 'l:59', 'l:5a', 'l:5b', 'l:5c', 'l:5d', 'l:5e', 'l:5f', 'l:60',
    'l:61', 'l:62', 'l:63', 'l:64', 'l:65', 'l:66', 'l:67', 'l:68', 'l:69', 'l:6a', 'l:6b', 'l:6c',
    'l:6d', 'l:6e', 'l:6f', 'l:70', 'l:71', 'l:72', 'l:73', 'l:74', 'l:75', 'l:76', 'l:77', 'l:78',
    'l:79', 'l:7a', 'l:7b', 'l:7c', 'l:7d', 'l:7e', 'l:7f', 'l:c2', 'l:c3', 'l:c4', 'l:c5', 'l:c6',
    'l:c7', 'l:c8', 'l:c9', 'l:ca', 'l:cb', 'l:cc', 'l:cd', 'l:ce', 'l:cf', 'l:d0', 'l:d1', 'l:d2',
    'l:d3', 'l:d4', 'l:d5', 'l:d6', 'l:d7', 'l:d8', 'l:d9', 'l:da', 'l:db', 'l:dc', 'l:dd', 'l:de',
    'l:df', 'l:e0', 'l:e1', 'l:e2', 'l:e3', 'l:e4', 'l:e5', 'l:e6', 'l:e7', 'l:e8', 'l:e9', 'l:ea',
    'l:eb', 'l:ec', 'l:ed', 'l:ee', 'l:ef', 'l:f0', 'l:f1', 'l:f2', 'l:f3', 'l:f4'
  }, {
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
    27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50,
    51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74,
    75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98,
    99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117,
    118, 119, 120, 121, 122, 123, 124, 125, 126, 127, 194, 195, 196, 197, 198, 199, 200, 201, 202,
    203, 204, 205, 206, 207, 208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221,
    222, 223, 224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239, 240,
    241, 242, 243, 244
  }
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
