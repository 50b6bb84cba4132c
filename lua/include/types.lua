-- Checking a queue-wide key's type before a script's first write: a key of
-- the wrong type (overwritten by hand) stops the script with VR_WRONGTYPE,
-- mapped to vr.CorruptQueueError (calls.script_error), instead of failing it
-- at that key's first command, after the writes before it (scripts do not
-- roll back). One TYPE each: for the scripts that run rarely (schedules,
-- limits); the hot paths read their keys' types as they go.

-- The types a key may be expected to have, as an error names them.
local TYPE_NAMES = {zset = 'sorted set', hash = 'hash', list = 'list', set = 'set', stream = 'stream'}

-- nil when `key` is of type `want` or absent, else what is wrong with it (for
-- a VR_WRONGTYPE error reply).
local function wrong_type(key, want)
  local t = redis.call('TYPE', key).ok
  if t == want or t == 'none' then
    return nil
  end
  return key .. ' is not a ' .. TYPE_NAMES[want]
end
