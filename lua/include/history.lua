-- Metrics history (docs/observability.md "Metrics history"): per queue, per
-- KIND and per minute, the jobs enqueued, completed, failed runs, dead, and
-- the sum of the completed runs' times in ms (for the mean), counted by the
-- script that makes each transition, in the same atomic step.
--
-- Two hashes a period, fields `<kind>\t<counter>` (a KIND is printable: no
-- tab), counters `enqueued`, `completed`, `failed`, `dead`, `run_ms`:
-- * `history:m:<s>`, the minute starting at <s> (epoch seconds), expiring
--   48 h after that minute's end;
-- * `history:h:<s>`, the hour starting at <s>, expiring 30 days after its end.
-- A script counts per call, not per job: its jobs' counts are summed by kind
-- first (history_count), then written with one HINCRBY per kind, counter and
-- hash (history_flush): a batch of 100 completions of one kind costs four.
-- The expiry is absolute (PEXPIREAT), set whenever a HINCRBY makes a field
-- (its reply is the amount), so a key never outlives its period's window.
--
-- Off by default (it costs the hot path: docs/observability.md gives the
-- figures). The switch is the queue meta hash's field `history`: absent =
-- HISTORY_DEFAULT, '0' = off, '1' = on (anything else = the default).
--
-- History is the last write of its script and never fails it: each HINCRBY
-- runs in a pcall, and a history key of the wrong type (or a field that is
-- no integer, made by hand) loses that count, with a WARNING in the Redis
-- server's log, while the transition stands (as events.lua does).

-- @include clock.lua
-- @include keys.lua

-- (tests/test_history.py checks this is _store/calls_obs.py's HISTORY_DEFAULT.)
local HISTORY_DEFAULT = '0'
-- How long a minute's and an hour's hash outlive their period (ms).
local HISTORY_MINUTE_KEEP = 48 * 3600000
local HISTORY_HOUR_KEEP = 30 * 24 * 3600000
-- This call's key prefix while history is on (nil: off, or not opened).
local history_on = nil
-- This call's counts: kind -> {counter -> amount}, written by history_flush.
local history_counts = nil

-- Read the switch (once per call): `field` is the meta hash's `history` field
-- when the caller read it anyway (false/nil = absent); else it is read here.
local function history_open(meta_key, prefix, field)
  local v = field
  if v == nil then v = redis.call('HGET', meta_key, 'history') end
  if v ~= '0' and v ~= '1' then v = HISTORY_DEFAULT end
  if v == '1' then
    history_on = prefix
    history_counts = {}
  end
end

-- Count `n` of `counter` for `kind` in this call (the caller checks history_on).
local function history_count(kind, counter, n)
  local c = history_counts[kind]
  if not c then
    c = {}
    history_counts[kind] = c
  end
  c[counter] = (c[counter] or 0) + n
end

-- One HINCRBY, and the key's expiry when it made the field.
local function history_incr(key, field, n, expire_at)
  local r = redis.pcall('HINCRBY', key, field, n)
  if type(r) == 'table' then
    if redis.log then
      redis.log(redis.LOG_WARNING, 'venturi: history not written to ' .. key .. ': ' .. tostring(r.err))
    end
  elseif r == n then
    redis.pcall('PEXPIREAT', key, expire_at)
  end
end

-- Write this call's counts to the minute and the hour of `now` (ms).
local function history_flush(now)
  if not history_on then return end
  local minute = now - now % 60000
  local hour = now - now % 3600000
  local mkey, hkey = history_keys(history_on, str(minute / 1000), str(hour / 1000))
  local mexp, hexp = str(minute + 60000 + HISTORY_MINUTE_KEEP), str(hour + 3600000 + HISTORY_HOUR_KEEP)
  for kind, c in pairs(history_counts) do
    for counter, n in pairs(c) do
      if n > 0 then
        local field = kind .. '\t' .. counter
        history_incr(mkey, field, n, mexp)
        history_incr(hkey, field, n, hexp)
      end
    end
  end
end
