-- schedule_pause: pause a schedule, or resume it (venturi schedule pause|resume).
--
-- KEYS[1]      the schedule's hash (venturi:{q}:schedule:<id>)
-- KEYS[2]      the due index: active schedule ids scored by next fire time (ms)
-- KEYS[3]      the schedules wake list: a resume leaves a token (at most one)
-- KEYS[4] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1]      now in ms, or '' for Redis TIME
-- ARGV[2]      key prefix of the queue (unused here; every script takes it)
-- ARGV[3]      the schedule id
-- ARGV[4]      'pause' or 'resume'
-- ARGV[5]      resume: the version the caller read (its next fire time was
--              computed from that definition)
-- ARGV[6]      resume: the first fire time after now ('' = none: it has ended)
--
-- A paused schedule leaves the due index: no worker fires it, and the fire
-- times it skips are not caught up on resume (resume continues from the next
-- fire time after now).
--
-- Returns {1, ''} when applied, {0, reason} when not (the schedule does not
-- exist, its key is not a hash: 'schedule is corrupt: ...', or, on resume, it
-- changed since it was read: read it again). A version that is not a number
-- (edited by hand) is bumped as 0: a pause is what an operator does to a
-- schedule gone wrong.
-- Errors: VR_WRONGTYPE when the due index or the wake list is of the wrong
-- type (nothing written).

-- @include clock.lua
-- @include schedule.lua

local now_s = str(now_ms(ARGV[1]))
local sched, sid = KEYS[1], ARGV[3]
local broken = wrong_type(KEYS[2], 'zset') or wrong_type(KEYS[3], 'list')
if broken then
  return redis.error_reply('VR_WRONGTYPE ' .. broken)
end
if redis.call('EXISTS', sched) == 0 then
  return {0, 'schedule does not exist'}
end
local fault = schedule_key_fault(sched)
if fault then
  return {0, SCHEDULE_CORRUPT .. fault}
end
local version = redis.call('HGET', sched, 'version') or ''
local bumped = next_version(version)
if ARGV[4] == 'pause' then
  redis.call('HSET', sched, 'paused', '1', 'version', bumped, 'updated_at', now_s)
  redis.call('ZREM', KEYS[2], sid)
  return {1, ''}
end
if version ~= ARGV[5] then
  return {0, 'schedule changed since it was read'}
end
local next_at = ARGV[6]
redis.call('HSET', sched, 'paused', '0', 'next_at', next_at, 'version', bumped, 'updated_at', now_s)
redis.call('HDEL', sched, 'note')
if next_at == '' then
  redis.call('ZREM', KEYS[2], sid)
else
  redis.call('ZADD', KEYS[2], next_at, sid)
  if redis.call('LLEN', KEYS[3]) == 0 then
    redis.call('RPUSH', KEYS[3], '1')
  end
end
return {1, ''}
