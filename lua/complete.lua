-- complete: RUNNING -> COMPLETED for one or more jobs of a queue, each for the
-- holder of its lease token only. Many jobs per call is the worker's batched
-- path: a burst of finished runs costs one script call, and each job is still
-- checked, written and journaled on its own (a refusal of one does not stop
-- the others).
--
-- KEYS[1] running zset   KEYS[2] completed zset
-- KEYS[3] queue meta hash (its `events` field: include events.lua)
-- The event stream (while events are on) and, for a run holding a
-- concurrency slot, which it gives back (include limits.lua), the
-- limits:state hash, limits:ready zset and wake list: their names derived
-- from the prefix on those paths only (keys.lua feature_keys), not in KEYS,
-- which every call pays for.
-- A job others wait on (its `dependents` flag, read with the lease check)
-- tells them here, in the same step (graph.lua; the queue-wide keys that
-- takes derive from the prefix: keys.lua graph_queue_keys).
-- ARGV[1] now in ms or ''
-- ARGV[2] key prefix of the queue ("venturi:{q}:"); job, journal and offload
--         snapshot keys derive from it (include offload.lua: an offload's
--         snapshot becomes `completed` with the result, and the redacted
--         wake-up is published)
-- ARGV[3] number of jobs n
-- ARGV[4..] 6 values per job: id, lease token, note, attachment (msgpack or
--         ''), carry (msgpack or '' = unchanged), result (msgpack or '')
--
-- Returns one value per job: 1 when completed, or the reason it was refused
-- (stale or unknown job; the refusal is journaled and nothing else is written
-- for that job; a job or journal key of the wrong type is refused with
-- nothing written, lease.lua check_owner, and quarantined by the reclaim).
-- Errors: VR_WRONGTYPE when the running or completed set is not a sorted set;
-- then no job is moved (only refusals are journaled).

-- @include clock.lua
-- @include keys.lua
-- @include lease.lua
-- @include offload.lua
-- @include graph.lua
-- @include limits.lua
-- @include wake.lua

local now = now_ms(ARGV[1])
local now_s = str(now)
local prefix = ARGV[2]
local fk = nil -- feature_keys(prefix), made when a feature needs one
local events = redis.call('HGET', KEYS[3], 'events')
if (events or EVENTS_DEFAULT) ~= '0' then
  fk = feature_keys(prefix)
  events_open(KEYS[3], fk.events, prefix, events or false)
end
local n = tonumber(ARGV[3])
-- check_owner's extra fields: the offload's two (OFFLOAD_FIELDS), then the
-- workflow flag.
local MORE = {OFFLOAD_FIELDS[1], OFFLOAD_FIELDS[2], 'dependents'}
local out = {}
-- First every job is checked (the only writes: refusals journaled), then
-- the two sets move every accepted job at once, and they are the first
-- writes: a wrong-type set fails there, with no job half moved.
local accepted, seen = {}, {}
local done, members = {}, {}
local woke = 0
local lim = nil -- limits_lib(), made for the first run that held a slot
for i = 0, n - 1 do
  local a = 4 + i * 6
  local id, token = ARGV[a], ARGV[a + 1]
  local job_key, journal_key = job_keys(prefix, id)
  if seen[id] then
    out[i + 1] = 'job is completed'
  else
    seen[id] = true
    local refused, run, f = check_owner(job_key, journal_key, token, 'complete', now_s,
      MORE)
    if refused then
      out[i + 1] = refused
    else
      accepted[#accepted + 1] = {i, a, job_key, journal_key, run, f}
      done[#done + 1] = id
      members[#members + 1] = now_s
      members[#members + 1] = id
      out[i + 1] = 1
    end
  end
end
if #accepted == 0 then
  return out
end
local added = redis.pcall('ZADD', KEYS[2], unpack(members))
if type(added) == 'table' and added.err then
  return redis.error_reply('VR_WRONGTYPE ' .. KEYS[2] .. ' is not a sorted set')
end
local removed = redis.pcall('ZREM', KEYS[1], unpack(done))
if type(removed) == 'table' and removed.err then
  redis.call('ZREM', KEYS[2], unpack(done)) -- the only write so far: undone
  return redis.error_reply('VR_WRONGTYPE ' .. KEYS[1] .. ' is not a sorted set')
end
for _, job in ipairs(accepted) do
  local a, job_key, journal_key, run, f = job[2], job[3], job[4], job[5], job[6]
  local id, note, attachment, carry, result =
    ARGV[a], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  -- The lease fields and an empty note are removed, not emptied (a field
  -- costs each retained hash ~15 B); the usual case is one HSET, one HDEL.
  if note == '' then
    redis.call('HSET', job_key, 'state', 'completed', 'finished_at', now_s,
      'updated_at', now_s)
  else
    redis.call('HSET', job_key, 'state', 'completed', 'note', note,
      'finished_at', now_s, 'updated_at', now_s)
  end
  if attachment == '' and result == '' then
    if note == '' then
      redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'note', 'attachment', 'result')
    else
      redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'attachment', 'result')
    end
  else
    clear_lease(job_key)
    if note == '' then redis.call('HDEL', job_key, 'note') end
    set_blob(job_key, 'attachment', attachment)
    set_blob(job_key, 'result', result)
  end
  if carry ~= '' then redis.call('HSET', job_key, 'carry', carry) end
  journal(journal_key, now_s, 'completed', run, note, attachment)
  compact_journal(journal_key)
  offload_settle(prefix, job_key, id, 'completed', result, nil, now, {f[5], f[6]})
  if f[7] then
    graph_finished(prefix, f[7], job_key, id, now, true, result, nil)
  end
  if f[4] then
    lim = lim or limits_lib()
    fk = fk or feature_keys(prefix)
    if lim.release(fk.limits_state, fk.limits_ready, job_key, f[4], now_s) then woke = woke + 1 end
  end
end
if woke > 0 then wake_workers(fk.wake, woke) end
return out
