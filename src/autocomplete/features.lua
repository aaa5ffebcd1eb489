-- Features: the optional indexes a dictionary keeps (prepended to the scripts that write or read
-- them). They are the letters of field 's' of the dictionary's features hash (<base>:f): 'r' the
-- ranked sets (b:, r:, t:, top), 'w' the words (w:, v), 's' the grams of words (vg:). A
-- dictionary without that hash never declared its features and keeps every index.
local ALL_FEATURES = 'rws'

-- The features of the dictionary whose features hash is `key`, as letters.
local function features_of(key)
  return redis.call('HGET', key, 's') or ALL_FEATURES
end

-- Whether feature letter `f` is one of `features`.
local function has_feature(features, f)
  return string.find(features, f, 1, true) ~= nil
end

-- The first letter of `need` that `features` lacks, or nil.
local function missing_feature(features, need)
  for i = 1, #need do
    local c = string.sub(need, i, i)
    if not has_feature(features, c) then
      return c
    end
  end
  return nil
end
