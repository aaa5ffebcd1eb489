-- Matching helpers shared by complete.lua and recent_complete.lua (prepended to both). Keys and
-- queries arrive normalized by Baton (NFKC, full case folding, whitespace collapsed); matching
-- compares bytes only. UTF-8 is self-synchronizing, so a byte match of a valid query starts and
-- ends on character boundaries.
--
-- Entries are matched where they lie: a key starts at byte `s` of an entry and ends just before
-- the next "\0" (lex members "<key>\0<id>" have s = 1, ranked members s = 9, recent list values
-- s = 1), so no key is copied out.

-- Match kinds, numbered as the proto's AutocompleteMatchKind.
local EXACT, PREFIX, WORD, SUFFIX, CONTAINS = 1, 2, 3, 4, 5

-- The query and the non-ASCII word separators (concatenated UTF-8), set by the script.
local Q, SEPS = '', ''

-- Whether the character just before byte i of m separates words: any ASCII character other
-- than a letter or digit, or one of SEPS.
local function separated(m, i)
  local b = string.byte(m, i - 1)
  if b < 128 then
    return not ((b >= 48 and b <= 57) or (b >= 97 and b <= 122) or (b >= 65 and b <= 90))
  end
  local j = i - 1
  while j > 1 do
    local c = string.byte(m, j)
    if c < 128 or c >= 192 then
      break
    end
    j = j - 1
  end
  -- A whole character found in the concatenation is that character (self-synchronization).
  return string.find(SEPS, string.sub(m, j, i - 1), 1, true) ~= nil
end

-- How the key at byte s of m matches Q: EXACT, PREFIX, WORD (a later word starts with Q),
-- CONTAINS, or 0.
local function kind_at(m, s)
  local i = string.find(m, Q, s, true)
  if not i then
    return 0 -- most entries a walk looks at: one search
  end
  local e = string.find(m, '\0', s, true) or (#m + 1)
  if i + #Q > e then
    return 0
  end
  if i == s then
    return i + #Q == e and EXACT or PREFIX
  end
  while i and i + #Q <= e do
    if separated(m, i) then
      return WORD
    end
    i = string.find(m, Q, i + 1, true)
  end
  return CONTAINS
end

-- The match kind of the key at byte s of m for `want`: a mode ('prefix', 'word', 'suffix',
-- 'contains'), or one group of the automatic mode (EXACT, PREFIX, WORD or CONTAINS: only that
-- kind). 0 when it does not match.
local function accept(want, m, s)
  if want == 'prefix' or want == PREFIX or want == EXACT then
    if string.sub(m, s, s + #Q - 1) ~= Q then
      return 0
    end
    local exact = (string.byte(m, s + #Q) or 0) == 0
    if want == 'prefix' then
      return exact and EXACT or PREFIX
    elseif want == EXACT then
      return exact and EXACT or 0
    end
    return exact and 0 or PREFIX
  elseif want == 'suffix' then
    local e = string.find(m, '\0', s, true) or (#m + 1)
    if e - #Q < s or string.sub(m, e - #Q, e - 1) ~= Q then
      return 0
    end
    return e - #Q == s and EXACT or SUFFIX
  end
  local kind = kind_at(m, s)
  if want == 'word' then
    return kind == CONTAINS and 0 or kind
  elseif want == 'contains' then
    return kind
  end
  return kind == want and kind or 0
end
