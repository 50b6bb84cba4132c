-- progress: a RUNNING job's progress, reported by its run (ctx.report_progress):
-- stored in the job hash's `progress` field and published as a `progress`
-- event (include events.lua), for the holder of the run's lease token only.
-- Not journaled: a progress report is a value, not a transition, and a
-- handler may report often (the worker rate-limits it; docs/observability.md).
--
-- KEYS[1] job hash   KEYS[2] queue meta hash   KEYS[3] event stream
-- KEYS[4] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''   ARGV[2] key prefix of the queue
-- ARGV[3] job id   ARGV[4] lease token   ARGV[5] value (msgpack)
--
-- Returns 1 when written, 0 when refused: the job is not running, or the
-- token is stale (its lease expired and the job was reclaimed). A refusal
-- writes nothing (not even a journal entry: a stale run may report many
-- times before it learns its lease is gone).

-- @include clock.lua
-- @include events.lua

local now = now_ms(ARGV[1])
local f = redis.pcall('HMGET', KEYS[1], 'state', 'lease_token', 'kind', 'run_count')
if f.err or f[1] ~= 'running' or f[2] ~= ARGV[4] then
  return 0
end
redis.call('HSET', KEYS[1], 'progress', ARGV[5])
events_open(KEYS[2], KEYS[3], ARGV[2])
if events_stream then
  emit(ARGV[3], f[3], 'progress', now, f[4], nil, {'value', ARGV[5]})
end
return 1
