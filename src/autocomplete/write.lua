-- Helpers shared by the scripts that change a dictionary (prepended, after rank.lua, to add.lua
-- and remove.lua): commands over many members are sent in chunks, one command per key, and every
-- key is checked against the declared ones before anything is written.
--
-- Two rules keep a write script whole on a Redis Cluster whose slot is being migrated:
-- - Every key it touches is one of its KEYS. Redis checks declared keys before the script runs
--   (TRYAGAIN or ASK, nothing written, when some are on the other node), but checks an undeclared
--   key only when the script reaches it: the script would stop there with its first writes made.
--   `declared` below finds an undeclared key while the script is still only reading.
-- - No command touches a key after a command of the same script may have emptied (and so
--   deleted) it: on the migrating node a missing key is "on the other node", and the command
--   would fail mid-script. Sizes are read before removals, and members are added before the old
--   ones are removed from the same set.

-- Arguments per command at most (Lua's unpack and Redis's argument vector stay small).
local CHUNK = 1000

-- The work this call did, in the units of Baton's step budget (`STEP_WORK`): one per member or
-- field read or written (each counted where it is read or written, `batched` and `hash_values`
-- below among them). The scripts return it, so that the budget is checked against what a step
-- really did.
local work = 0

-- Redis's clock when the script started, to say how long it ran (`elapsed`).
local STARTED = redis.call('TIME')

-- Microseconds since the script started, by Redis's clock (stalls of Redis included).
local function elapsed()
  local now = redis.call('TIME')
  local seconds = tonumber(now[1]) - tonumber(STARTED[1])
  return seconds * 1000000 + tonumber(now[2]) - tonumber(STARTED[2])
end

-- Runs `cmd key args...` in chunks (args holds `width`-argument groups, 1 when not given);
-- returns the sum of the integer replies.
local function batched(cmd, key, args, width)
  local step, sum = CHUNK * (width or 1), 0
  work = work + #args / (width or 1)
  for first = 1, #args, step do
    sum = sum + redis.call(cmd, key, unpack(args, first, math.min(first + step - 1, #args)))
  end
  return sum
end

-- The units of a word added to or removed from the set of one of its grams: a command on a set
-- of its own each, which costs Redis about four times a member written with others (Baton's
-- GRAM_WORK, which a unit test keeps equal).
local GRAM_WORK = 4

-- Runs `cmd key words...` on a gram set, counting GRAM_WORK units a word.
local function gram_batched(cmd, key, words)
  work = work + (GRAM_WORK - 1) * #words
  return batched(cmd, key, words)
end

-- The values of `fields` in hash `key`, as a table field -> value (false when missing).
local function hash_values(key, fields)
  local values = {}
  work = work + #fields
  for first = 1, #fields, CHUNK do
    local last = math.min(first + CHUNK - 1, #fields)
    local got = redis.call('HMGET', key, unpack(fields, first, last))
    for i = first, last do
      values[fields[i]] = got[i - first + 1]
    end
  end
  return values
end

-- Appends `item` to the list `lists[name]`, noting new names in `order`.
local function group(lists, order, name, item)
  local list = lists[name]
  if list == nil then
    list = {}
    lists[name] = list
    order[#order + 1] = name
  end
  list[#list + 1] = item
end

-- The declared keys, and the first key named through `declared` that is not one of them.
local DECLARED, UNDECLARED = {}, nil
for i = 1, #KEYS do
  DECLARED[KEYS[i]] = true
end

-- The key <base>:<name>, noting it when it is not declared (the script then refuses to run,
-- before its first write: see `check_declared`).
local function declared(base, name)
  local k = base .. ':' .. name
  if not DECLARED[k] then
    UNDECLARED = UNDECLARED or k
  end
  return k
end

-- Raises when a key named so far is not declared. Called after the reads that decide what to
-- write, before the first write: a bug in Baton's list of keys fails the call with nothing
-- written instead of a Cluster failing it halfway.
local function check_declared()
  if UNDECLARED then
    error('the script would touch the undeclared key ' .. UNDECLARED)
  end
end

-- How many lex sets (and first-byte ranked sets) there can be: one per byte a matching form can
-- start with (all_first_byte_names), counted once rather than built by every call.
local FIRST_BYTES = 127 + (244 - 194 + 1)

-- The names of every lex set and first-byte ranked set there can be, in byte order, which a
-- step declares only when it asks for every one (`wide`).
local function all_first_byte_names()
  local lex, ranked = {}, {}
  for b = 1, 244 do
    if b < 128 or b >= 194 then
      lex[#lex + 1] = lex_name(string.char(b))
      ranked[#ranked + 1] = set_name(string.char(b))
    end
  end
  return lex, ranked
end
