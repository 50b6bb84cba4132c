-- resume: SUSPENDED -> PENDING with an input for the next run.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] suspended zset
-- KEYS[4] dedup index hash   KEYS[5] wake list
-- KEYS[6..9] pending zsets, CRITICAL first: the job's priority field picks one
-- KEYS[10] queue meta hash   KEYS[11] event stream (include events.lua)
-- KEYS[12] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''   ARGV[2] key prefix of the queue
-- ARGV[3] job id   ARGV[4] resume input (msgpack)
--
-- Returns {1}, or {0, reason} when the job is unknown or not suspended
-- (nothing written).
-- Errors: VR_CORRUPTJOB when the job's own data is corrupt (its job key not a
-- hash, its journal not a stream, no state field: operator.lua; a priority
-- that names no pending set); nothing written.

-- @include clock.lua
-- @include keys.lua
-- @include journal.lua
-- @include dedup.lua
-- @include wake.lua
-- @include operator.lua

local id = ARGV[3]
local f, corrupt = read_job(KEYS[1], KEYS[2], {'state', 'priority', 'run_count'})
if corrupt then
  return corrupt_job(id, corrupt)
end
if not f[1] then
  return {0, 'job does not exist'}
end
if f[1] ~= 'suspended' then
  return {0, 'job is ' .. f[1]}
end
local pending = pending_key(6, f[2])
if not pending then
  return corrupt_job(id, bad_priority(f[2]))
end
local now = now_ms(ARGV[1])
local now_s = str(now) -- the writes' string, made once (clock.lua str)
events_open(KEYS[10], KEYS[11], ARGV[2])
redis.call('ZREM', KEYS[3], id)
redis.call('HSET', KEYS[1], 'state', 'pending', 'resume_input', ARGV[4],
  'eligible_at', now_s, 'updated_at', now_s)
back_to_pending(pending, KEYS[4], KEYS[1], id, now_s)
journal(KEYS[2], now_s, 'resumed', f[3], nil, ARGV[4])
wake_workers(KEYS[5], 1)
return {1}
