-- The schedule scripts' checks (docs/guarantees.md, "Corrupt schedules"): each
-- script reads what it depends on before its first write, since a script that
-- fails half way is not rolled back. A schedule whose own data is corrupt is
-- paused with a note (it is no other schedule's fault, so the fire round goes
-- on to the next); a queue-wide key of the wrong type stops the script.

-- @include clock.lua
-- @include keys.lua
-- @include types.lua

-- How a corrupt schedule's note starts (_model/schedule.py CORRUPT: the
-- readers mark a schedule by it; tests/test_schedules_corrupt.py checks both).
local SCHEDULE_CORRUPT = 'schedule is corrupt: '

-- What a schedule's key holds when it is not a hash: its note.
local function schedule_key_fault(sched)
  local t = redis.call('TYPE', sched).ok
  if t == 'hash' or t == 'none' then
    return nil
  end
  return 'its key is a ' .. t .. ', not a hash'
end

-- The version after `v` (nil: none yet). One edited by hand into anything but
-- a count of at most 15 digits (`v1`, `1e400`) counts as 0: the script that
-- bumps it (a pause, a declaration) repairs it.
local function next_version(v)
  if v and string.match(v, '^%d+$') and #v <= 15 then
    return str(tonumber(v) + 1)
  end
  return '1'
end

-- What is wrong with the fields schedule_fire.lua reads and writes, nil when
-- nothing: `f` is {version, paused, next_at, kind, priority, payload, dedup,
-- limit_key, fires} as HMGET gave them, `pending` the set the priority picks
-- (nil: it names none). A count must stay one HINCRBY takes (15 digits).
-- The timing fields are the caller's to check (cron and zones are Python's).
local function schedule_fault(f, pending)
  if not f[1] then
    return 'version field is missing'
  end
  if f[2] and f[2] ~= '0' and f[2] ~= '1' then
    return 'paused field ' .. string.format('%q', f[2]) .. ' is not 0 or 1'
  end
  if not f[4] or f[4] == '' then
    return 'kind field is missing'
  end
  if not f[6] then
    return 'payload field is missing'
  end
  if not pending then
    return bad_priority(f[5])
  end
  if f[9] and not (string.match(f[9], '^%d+$') and #f[9] <= 15) then
    return 'fires field ' .. string.format('%q', f[9]) .. ' is not a count'
  end
  return nil
end

-- Pause a schedule whose own data is corrupt, with `what` as its note, and take
-- it out of the due index (`due`), so that it no longer comes first in every
-- fire round. Its key is a hash (the caller checked); the version is left as
-- it is (a non-numeric one is part of what declaring it again repairs).
local function schedule_quarantine(sched, due, sid, what)
  local note = SCHEDULE_CORRUPT .. what
  redis.call('HSET', sched, 'paused', '1', 'note', note)
  redis.call('ZREM', due, sid)
  return note
end
