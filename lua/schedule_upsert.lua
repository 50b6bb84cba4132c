-- schedule_upsert: create a schedule, or replace its definition (queue.schedule()).
--
-- KEYS[1]      the schedule's hash (venturi:{q}:schedule:<id>)
-- KEYS[2]      the queue's set of schedule ids
-- KEYS[3]      the due index: active schedule ids scored by next fire time (ms)
-- KEYS[4]      the schedules wake list: a token tells an idle worker to look
-- KEYS[5] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1]      now in ms, or '' for Redis TIME
-- ARGV[2]      key prefix of the queue (unused here; every script takes it)
-- ARGV[3]      the schedule id
-- ARGV[4]      the timing's fingerprint (cron or every, tz, start_at, end_at)
-- ARGV[5]      the first fire time, computed by the caller from now ('' = none)
-- ARGV[6]      an interval schedule's anchor (its first fire time), else ''
-- ARGV[7..]    field, value pairs of the definition (kind, payload, priority,
--              dedup, limit_key, cron, every_ms, tz, start_at, end_at)
--
-- A definition equal to the stored one is a no-op: a fleet of workers that
-- declare the same schedule at start (vr.Worker(schedules=...)) leaves its
-- next fire time, and a fire time missed while no worker ran, alone. A new
-- timing (its fingerprint differs) takes ARGV[5] as the next fire time; a new
-- task with the same timing keeps the stored one. Paused stays paused.
--
-- A change that leaves the schedule active leaves one token on KEYS[4] (never
-- more than one): the idle worker whose BLPOP pops it looks at the due index
-- at once, instead of at its next periodic look (docs/schedules.md).
--
-- A schedule whose own data is corrupt is repaired by being declared again
-- (a worker's start does it): a key that is not a hash is replaced; a hash
-- whose bookkeeping (version, fires, paused, next_at, anchor) is not what the
-- scripts write, or that a fire paused as corrupt (its note starts 'schedule
-- is corrupt: '), is written whole as a new timing: the next fire time from
-- ARGV[5], a count of fires that is not one restarted at 0, the quarantine's
-- pause lifted (an operator's pause of a sound schedule stays).
--
-- Returns {created, changed, next_at, repaired}: 1/0, 1/0, the next fire time
-- ('' none), and what was repaired ('' nothing; the caller logs it).
-- Errors: VR_BADARG for a next fire time or anchor that is not a number, or an
-- odd list of pairs; VR_WRONGTYPE when the set of schedule ids, the due index
-- or the wake list is of the wrong type. Nothing is written then.

-- @include clock.lua
-- @include schedule.lua

local now_s = str(now_ms(ARGV[1]))
local sched, sid, fp, next_at, anchor = KEYS[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if (next_at ~= '' and not string.match(next_at, '^%d+$'))
    or (anchor ~= '' and not string.match(anchor, '^%d+$')) or (#ARGV - 6) % 2 ~= 0 then
  return redis.error_reply('VR_BADARG schedule ' .. sid .. ': bad next fire time, anchor or fields')
end
local broken = wrong_type(KEYS[2], 'set') or wrong_type(KEYS[3], 'zset') or wrong_type(KEYS[4], 'list')
if broken then
  return redis.error_reply('VR_WRONGTYPE ' .. broken)
end
local repaired = schedule_key_fault(sched) or ''
if repaired ~= '' then
  redis.call('DEL', sched) -- the schedule's own key, not a hash: the declaration replaces it
end
local cur = redis.call('HMGET', sched, 'version', 'timing', 'next_at', 'paused', 'fires', 'anchor', 'note')
local created = redis.call('EXISTS', sched) == 0
if not created and repaired == '' then
  local function count(v) return v and string.match(v, '^%d+$') and #v <= 15 end
  if not count(cur[1]) then
    repaired = 'version field ' .. string.format('%q', cur[1] or '')
  elseif cur[5] and not count(cur[5]) then
    repaired = 'fires field ' .. string.format('%q', cur[5])
  elseif cur[4] ~= '0' and cur[4] ~= '1' then
    repaired = 'paused field ' .. string.format('%q', cur[4] or '')
  elseif cur[3] and cur[3] ~= '' and not count(cur[3]) then
    repaired = 'next_at field ' .. string.format('%q', cur[3])
  elseif cur[6] and cur[6] ~= '' and not count(cur[6]) then
    repaired = 'anchor field ' .. string.format('%q', cur[6])
  elseif cur[7] and string.sub(cur[7], 1, #SCHEDULE_CORRUPT) == SCHEDULE_CORRUPT then
    repaired = string.sub(cur[7], #SCHEDULE_CORRUPT + 1)
  end
end
local new_timing = created or repaired ~= '' or cur[2] ~= fp
local changed = new_timing
if not changed then
  for i = 7, #ARGV, 2 do
    if redis.call('HGET', sched, ARGV[i]) ~= ARGV[i + 1] then
      changed = true
      break
    end
  end
end
if not changed then
  return {0, 0, cur[3] or '', ''}
end
for i = 7, #ARGV, 2 do
  redis.call('HSET', sched, ARGV[i], ARGV[i + 1])
end
if new_timing then
  redis.call('HSET', sched, 'timing', fp, 'next_at', next_at, 'anchor', anchor)
else
  next_at = cur[3] or ''
end
redis.call('HSET', sched, 'version', next_version(cur[1]), 'updated_at', now_s)
local paused = cur[4]
if created then
  redis.call('HSET', sched, 'created_at', now_s, 'paused', '0', 'fires', '0')
  paused = '0'
elseif repaired ~= '' then
  if paused ~= '1' or (cur[7] and string.sub(cur[7], 1, #SCHEDULE_CORRUPT) == SCHEDULE_CORRUPT) then
    paused = '0' -- not a pause an operator made
  end
  redis.call('HSET', sched, 'paused', paused)
  if cur[5] and not (string.match(cur[5], '^%d+$') and #cur[5] <= 15) then
    redis.call('HSET', sched, 'fires', '0')
  end
end
redis.call('HDEL', sched, 'note')
redis.call('SADD', KEYS[2], sid)
if paused == '1' or next_at == '' then
  redis.call('ZREM', KEYS[3], sid)
else
  redis.call('ZADD', KEYS[3], next_at, sid)
  if redis.call('LLEN', KEYS[4]) == 0 then
    redis.call('RPUSH', KEYS[4], '1')
  end
end
return {created and 1 or 0, 1, next_at, repaired}
