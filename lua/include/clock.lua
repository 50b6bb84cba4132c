-- Numbers as strings, and the one clock.

-- Redis's Lua (5.1) turns a number into a string, for redis.call or `..`,
-- with sprintf("%.14g"). That was the largest single cost in these scripts:
-- 15 conversions per job lifecycle took ~11% of Redis's instructions per job
-- (callgrind, claim + complete). The numbers we write are integers (ms
-- timestamps, counts), and '%d' formats those several times faster. Hot paths
-- convert each value once and pass the string on; `str` leaves strings alone.
-- Integers only: '%d' would drop a fraction.
local format = string.format
local function str(x)
  if type(x) == 'number' then
    return format('%d', x)
  end
  return x
end

-- The one clock: the caller's milliseconds when given (tests, or a deployment
-- that wants its own clock), otherwise Redis TIME read once at the top.
local function now_ms(arg)
  if arg ~= nil and arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  -- Lua turns TIME's two strings into numbers for the arithmetic itself.
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- A time in ms as stored (created_at, expires_at...): digits only, so it can
-- also be the id of a job's `enqueued` journal entry (journal.lua).
local function is_time(value)
  return value ~= nil and value ~= false and string.match(value, '^%d+$') ~= nil
end
