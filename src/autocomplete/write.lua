-- Helpers shared by the scripts that change a dictionary (prepended, after rank.lua, to add.lua
-- and remove.lua): commands over many members are sent in chunks, one command per key.

-- Arguments per command at most (Lua's unpack and Redis's argument vector stay small).
local CHUNK = 1000

-- Runs `cmd key args...` in chunks (args holds `width`-argument groups, 1 when not given).
local function batched(cmd, key, args, width)
  local step = CHUNK * (width or 1)
  for first = 1, #args, step do
    redis.call(cmd, key, unpack(args, first, math.min(first + step - 1, #args)))
  end
end

-- The values of `fields` in hash `key`, as a table field -> value (false when missing).
local function hash_values(key, fields)
  local values = {}
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
