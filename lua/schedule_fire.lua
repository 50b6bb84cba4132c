-- schedule_fire: one schedule's fire. Its job is created and its next fire time
-- advanced in one atomic step, and only if the schedule is still as the caller
-- read it (compare-and-advance): two workers that fire the same due fire time
-- make one job, and a worker that dies before this script runs made nothing,
-- so another worker fires it (docs/design.md, "Schedules").
--
-- KEYS[1]      the schedule's hash (venturi:{q}:schedule:<id>)
-- KEYS[2]      the due index: active schedule ids scored by next fire time (ms)
-- KEYS[3]      dedup index hash
-- KEYS[4]      wake list: one token for the job created (wake.lua)
-- KEYS[5]      the new job's hash
-- KEYS[6]      the new job's journal stream
-- KEYS[7..10]  the pending sets, CRITICAL first: the schedule's priority picks one
-- KEYS[11]     queue meta hash (its `history` field: include history.lua, the
--              job created counted by kind)
-- KEYS[12]     event stream (include events.lua: the job created is an
--              `enqueued` event)
-- KEYS[13] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1]      now in ms, or '' for Redis TIME
-- ARGV[2]      key prefix of the queue (events.lua takes its length)
-- ARGV[3]      'fire' (the due fire time ARGV[6]), 'trigger' (one extra job now,
--              the next fire time untouched) or 'quarantine' (the caller found
--              the schedule's timing fields corrupt: pause it, note ARGV[10])
-- ARGV[4]      the schedule id
-- ARGV[5]      the schedule's version as the caller read it ('' = any: trigger)
-- ARGV[6]      fire: the next_at the caller read, the fire time the job stands for
-- ARGV[7]      fire: the first fire time after now ('' = none: the schedule ends)
-- ARGV[8]      fire: how many fire times the job stands for (more than 1 after
--              downtime: one job for all the fire times missed)
-- ARGV[9]      the job id (fire: derived from the schedule and the fire time, so
--              a fire time can name one job only)
-- ARGV[10]     quarantine: what is wrong with the schedule (its note), else ''
--
-- Returns {status, id}:
--   {1, job id}    the job was created (pending, eligible now)
--   {2, holder}    the schedule's task has a dedup key that a pending job holds:
--                  no job created (the caller applies the task's merge, as any
--                  enqueue does); the schedule advanced
--   {3, job id}    that job exists already (this fire time was enqueued before);
--                  the schedule advanced
--   {0, reason}    nothing written: the schedule is gone, paused, changed, not
--                  due, or another worker fired this fire time first
--
-- Everything is read and checked before the first write (include schedule.lua).
-- A schedule whose own data is corrupt (its key not a hash, a field this script
-- reads or writes that it cannot use, the caller's ARGV[10], a key in the new
-- job's journal's place) is paused with a note instead, taken out of the
-- due index, and {0, note} returned, the note starting 'schedule is corrupt: '
-- (a key that is not a hash can hold no note: it only leaves the index); a
-- trigger writes nothing and returns {0, note}. An entry of the due index
-- that names no schedule, or a paused one, is dropped; one scored before the
-- schedule's own next fire time is scored at it again.
-- Errors: VR_WRONGTYPE when a queue-wide key it writes is of the wrong type
-- (the due index, dedup index, wake list, meta hash, the pending set, or the
-- event stream while events are on); VR_BADARG for a next fire time not after
-- the fire time. Nothing is written then.

-- @include clock.lua
-- @include keys.lua
-- @include journal.lua
-- @include wake.lua
-- @include schedule.lua
-- @include history.lua

local now = now_ms(ARGV[1])
local now_s = str(now)
local sched, due_key = KEYS[1], KEYS[2]
local mode, sid, version, id = ARGV[3], ARGV[4], ARGV[5], ARGV[9]
local broken = wrong_type(due_key, 'zset') or wrong_type(KEYS[3], 'hash') or wrong_type(KEYS[4], 'list')
  or wrong_type(KEYS[11], 'hash')
if broken then
  return redis.error_reply('VR_WRONGTYPE ' .. broken)
end
-- The event switch is read here, not by events_open: a value no XADD MAXLEN
-- takes (an operator's 99999999999999999999) is the default, so the job's
-- event cannot fail the script after the job was written.
local switch, hswitch = unpack(redis.call('HMGET', KEYS[11], 'events', 'history'))
if switch and not (string.match(switch, '^%d+$') and #switch <= 10) then
  switch = EVENTS_DEFAULT
end
events_open(KEYS[11], KEYS[12], ARGV[2], switch or false)
history_counts = hswitch == '1' and {} or nil
broken = events_stream and wrong_type(KEYS[12], 'stream')
if broken then
  return redis.error_reply('VR_WRONGTYPE ' .. broken)
end

-- A worker's fire sets a corrupt schedule aside (paused, out of the due index);
-- an operator's trigger is refused with nothing written, as the operator
-- scripts refuse a corrupt job: the operator is there to see why.
local quarantine = schedule_quarantine
if mode == 'trigger' then
  quarantine = function(_, _, _, what) return SCHEDULE_CORRUPT .. what end
end
local t = redis.call('TYPE', sched).ok
if t == 'none' then
  -- unschedule() removes the hash and the index entry together: an entry
  -- left alone would be due in every fire round, for ever.
  if mode ~= 'trigger' then redis.call('ZREM', due_key, sid) end
  return {0, 'schedule does not exist'}
end
local fault = schedule_key_fault(sched)
if fault then
  if mode ~= 'trigger' then redis.call('ZREM', due_key, sid) end
  return {0, SCHEDULE_CORRUPT .. fault}
end
local f = redis.call('HMGET', sched, 'version', 'paused', 'next_at', 'kind', 'priority', 'payload', 'dedup',
  'limit_key', 'fires')
if version ~= '' and f[1] ~= version then
  return {0, 'schedule changed since it was read'}
end
if mode == 'quarantine' then
  return {0, quarantine(sched, due_key, sid, ARGV[10])}
end
local pending = pending_key(7, f[5])
fault = schedule_fault(f, pending)
if fault then
  return {0, quarantine(sched, due_key, sid, fault)}
end
local fire_at, fires = now_s, '1'
if mode == 'fire' then
  if f[2] == '1' then
    redis.call('ZREM', due_key, sid) -- a paused schedule is in no due index (schedule_pause)
    return {0, 'schedule is paused'}
  end
  if f[3] ~= ARGV[6] then
    return {0, 'fire time already fired'}
  end
  local due = tonumber(ARGV[6])
  if due == nil then
    return {0, 'not due'}
  end
  if due > now then
    -- The index said due, the schedule says later: the index follows it.
    redis.call('ZADD', due_key, 'XX', ARGV[6], sid)
    return {0, 'not due'}
  end
  if ARGV[7] ~= '' and not (tonumber(ARGV[7]) and tonumber(ARGV[7]) > due) then
    return redis.error_reply('VR_BADARG next fire time ' .. ARGV[7] .. ' is not after ' .. ARGV[6])
  end
  fire_at, fires = ARGV[6], ARGV[8]
end
broken = wrong_type(pending, 'zset')
if broken then
  return redis.error_reply('VR_WRONGTYPE ' .. broken)
end

-- What becomes of the fire, decided by reads alone.
local status, out = 1, id
local field = f[7] or ''
if field ~= '' then
  local holder = redis.call('HGET', KEYS[3], field)
  if holder and holder ~= id then
    status, out = 2, holder
  end
end
if status == 1 and redis.call('EXISTS', KEYS[5]) == 1 then
  status = 3
end
if status == 1 then
  -- The job's id is the schedule's and the fire time's, and its `enqueued`
  -- entry gets an explicit id (created_at-0), which a stream left there by
  -- hand may already be past: its place is taken, by something else.
  local jt = redis.call('TYPE', KEYS[6]).ok
  if jt ~= 'none' then
    local what = jt == 'stream' and ' exists without its job' or ' is not a stream'
    return {0, quarantine(sched, due_key, sid, 'the journal key of its job ' .. id .. what)}
  end
end

if status == 1 then
  if field ~= '' then redis.call('HSET', KEYS[3], field, id) end
  redis.call('HSET', KEYS[5],
    'kind', f[4], 'state', 'pending', 'priority', f[5],
    'eligible_at', now_s, 'created_at', now_s, 'payload', f[6],
    'schedule', sid, 'fire_at', fire_at, 'fires', fires, 'run_count', '0')
  if field ~= '' then redis.call('HSET', KEYS[5], 'dedup', field) end
  -- Task.limit_key(): the claim parks a job of a limited kind under it (limits.lua).
  if f[8] and f[8] ~= '' then redis.call('HSET', KEYS[5], 'limit_key', f[8]) end
  redis.call('ZADD', pending, now_s, id)
  -- The `enqueued` entry is written now, not left to the job's first event
  -- (enqueue.lua's way): it names the schedule and the fire times it stands for.
  -- `run_count` '0' says the journal exists, so the claim reads it for the
  -- first run's history (journal.lua: a pending job has a journal exactly
  -- when its hash has run_count).
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', JOURNAL_MAXLEN, enqueued_id(now_s),
    'event', 'enqueued', 'at', now_s, 'run', '0', 'priority', f[5], 'eligible_at', now_s,
    'schedule', sid, 'fire_at', fire_at, 'fires', fires)
  compact_journal(KEYS[6])
  if events_stream then
    emit(id, f[4], 'enqueued', now_s, 0, nil, {'priority', f[5], 'eligible_at', now_s,
      'schedule', sid, 'fire_at', fire_at, 'fires', fires})
  end
  wake_workers(KEYS[4], 1)
  if history_counts then
    history_count(f[4], 'enqueued', 1)
    history_flush(ARGV[2], now)
  end
end
redis.call('HSET', sched, 'last_at', fire_at, 'last_job_id', out)
redis.call('HINCRBY', sched, 'fires', 1)
if mode == 'fire' then
  if ARGV[7] == '' then
    redis.call('HSET', sched, 'next_at', '')
    redis.call('ZREM', due_key, sid)
  else
    redis.call('HSET', sched, 'next_at', ARGV[7])
    redis.call('ZADD', due_key, ARGV[7], sid)
  end
end
return {status, out}
