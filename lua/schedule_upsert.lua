-- schedule_upsert: create a schedule, or replace its definition (queue.schedule()).
--
-- KEYS[1]      the schedule's hash (venturi:{q}:schedule:<id>)
-- KEYS[2]      the queue's set of schedule ids
-- KEYS[3]      the due index: active schedule ids scored by next fire time (ms)
-- KEYS[4]      the schedules wake list: a token tells an idle worker to look
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
-- Returns {created, changed, next_at}: 1/0, 1/0, the next fire time ('' none).
-- Errors: VR_BADARG for a next fire time or anchor that is not a number, or an
-- odd list of pairs (nothing written).

-- @include clock.lua

local now_s = str(now_ms(ARGV[1]))
local sched, sid, fp, next_at, anchor = KEYS[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if (next_at ~= '' and not string.match(next_at, '^%d+$'))
    or (anchor ~= '' and not string.match(anchor, '^%d+$')) or (#ARGV - 6) % 2 ~= 0 then
  return redis.error_reply('VR_BADARG schedule ' .. sid .. ': bad next fire time, anchor or fields')
end
local cur = redis.call('HMGET', sched, 'version', 'timing', 'next_at', 'paused')
local created = not cur[1]
local new_timing = created or cur[2] ~= fp
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
  return {0, 0, cur[3] or ''}
end
for i = 7, #ARGV, 2 do
  redis.call('HSET', sched, ARGV[i], ARGV[i + 1])
end
if new_timing then
  redis.call('HSET', sched, 'timing', fp, 'next_at', next_at, 'anchor', anchor)
else
  next_at = cur[3] or ''
end
redis.call('HSET', sched, 'version', str((tonumber(cur[1]) or 0) + 1), 'updated_at', now_s)
if created then
  redis.call('HSET', sched, 'created_at', now_s, 'paused', '0', 'fires', '0')
end
redis.call('HDEL', sched, 'note')
redis.call('SADD', KEYS[2], sid)
if cur[4] == '1' or next_at == '' then
  redis.call('ZREM', KEYS[3], sid)
else
  redis.call('ZADD', KEYS[3], next_at, sid)
  if redis.call('LLEN', KEYS[4]) == 0 then
    redis.call('RPUSH', KEYS[4], '1')
  end
end
return {created and 1 or 0, 1, next_at}
