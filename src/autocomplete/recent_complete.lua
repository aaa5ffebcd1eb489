-- Complete over a recent list: its items matching a query, most recent first (in 'auto' mode,
-- grouped by match kind: exact, prefix, word prefix, contains). Reads only (flags=no-writes).
-- A recent list holds at most 1000 items, so reading it whole is bounded.
--
-- KEYS[1] order   KEYS[2] items   (as in recent_record.lua)
-- ARGV[1] mode: 'prefix' | 'word' | 'suffix' | 'contains' | 'auto'
-- ARGV[2] limit   ARGV[3] the normalized query
-- ARGV[4] auto mode: the group the page starts in
-- ARGV[5] where the previous page stopped: '' or a recorded-at time, exclusive
-- ARGV[6] the non-ASCII word separators
--
-- Returns {next group (0 when there is nothing more), next position, then per item: id,
-- recorded at (as text), item value, match kind}.
local mode, limit = ARGV[1], tonumber(ARGV[2])
Q = ARGV[3]
local group, pos = tonumber(ARGV[4]), ARGV[5]
SEPS = ARGV[6]
local before = pos ~= '' and tonumber(pos) or nil

local rows = redis.call('ZREVRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local ids = {}
for i = 1, #rows / 2 do
  ids[i] = rows[2 * i - 1]
end
local values = #ids > 0 and redis.call('HMGET', KEYS[2], unpack(ids)) or {}

local groups = mode == 'auto' and { EXACT, PREFIX, WORD, CONTAINS } or { mode }
local start = 1
if mode == 'auto' then
  while groups[start] ~= group do
    start = start + 1
    if start > #groups then
      return redis.error_reply('ERR unknown group')
    end
  end
end

local reply = { 0, '' }
local found, last_group = 0, nil
for g = start, #groups do
  local want = groups[g]
  for i = 1, #ids do
    local stamp = tonumber(rows[2 * i])
    local v = values[i]
    if v and (g ~= start or before == nil or stamp < before) then
      local kind = accept(want, v, 1)
      if kind > 0 then
        if found == limit then
          reply[1] = mode == 'auto' and groups[g] or 1
          if last_group ~= g then
            -- The page ended with an earlier group: the next one starts at this group's top.
            reply[2] = ''
          end
          return reply
        end
        found = found + 1
        reply[#reply + 1] = ids[i]
        reply[#reply + 1] = rows[2 * i]
        reply[#reply + 1] = v
        reply[#reply + 1] = kind
        reply[2] = rows[2 * i]
        last_group = g
      end
    end
  end
end
reply[2] = ''
return reply
