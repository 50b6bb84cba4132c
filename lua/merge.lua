-- merge: apply a dedup merge decision to a pending job. Runs inside the
-- MULTI/EXEC of the client's optimistic loop, after a WATCH on the job hash,
-- so the job is known to be unchanged since the client read it; the state
-- check below is a second line of defence, made before any write.
--
-- KEYS[1] job hash   KEYS[2] journal stream
-- KEYS[3] pending zset of the job's current priority
-- KEYS[4] pending zset of the new priority (same as KEYS[3] when unchanged)
-- KEYS[5] wake list
-- KEYS[6] queue meta hash   KEYS[7] event stream (include events.lua)
-- KEYS[8] limits:parked zset: a job parked on a limit (include limits.lua)
--         moves there to its new priority instead
-- ARGV[1] now in ms or ''   ARGV[2] key prefix of the queue
-- ARGV[3] job id   ARGV[4] decision: keep | replace | with
-- ARGV[5] new payload (msgpack; ignored for keep)
-- ARGV[6] carry action: keep | reset | set   ARGV[7] carry (msgpack, for set)
-- ARGV[8] new priority label
-- ARGV[9] the id the merging enqueue generated (journaled as `by`: after a
--         lost EXEC reply, the client finds it and does not merge again)
--
-- Returns 1, or 0 when the job is no longer pending (nothing written).
-- Errors: VR_CORRUPTJOB when the job's own data is corrupt (its job key not a
-- hash, its journal not a stream, no state field: operator.lua); nothing
-- written. The client's reads refuse such a job first (_producer/dedup.py);
-- this is the second line of defence, as the state check is.

-- @include clock.lua
-- @include journal.lua
-- @include wake.lua
-- @include limits.lua
-- @include operator.lua

local id = ARGV[3]
local f, corrupt = read_job(KEYS[1], KEYS[2], {'state', 'run_count', 'priority', 'parked'})
if corrupt then
  return corrupt_job(id, corrupt)
end
if f[1] ~= 'pending' then
  return 0
end
-- Journal the `enqueued` entry first if nothing has yet, while the hash still
-- holds the enqueue-time priority.
materialize(KEYS[1], KEYS[2])
local now = now_ms(ARGV[1])
events_open(KEYS[6], KEYS[7], ARGV[2])
local decision = ARGV[4]
local extra = {'decision', decision, 'by', ARGV[9]}
if decision ~= 'keep' then
  redis.call('HSET', KEYS[1], 'payload', ARGV[5], 'updated_at', now)
  if ARGV[6] == 'reset' then
    redis.call('HDEL', KEYS[1], 'carry')
  elseif ARGV[6] == 'set' then
    redis.call('HSET', KEYS[1], 'carry', ARGV[7])
  end
  if ARGV[8] ~= f[3] then
    if f[4] then
      -- <entity>\t<level><id>: the same entity, the new level.
      local lim = limits_lib()
      local member = string.sub(f[4], 1, #f[4] - #id - 1) .. (lim.LEVEL[ARGV[8]] or '2') .. id
      lim.unpark(KEYS[8], f[4])
      redis.call('ZADD', KEYS[8], 0, member)
      redis.call('HSET', KEYS[1], 'parked', member)
    else
      local score = redis.call('ZSCORE', KEYS[3], id)
      redis.call('ZREM', KEYS[3], id)
      redis.call('ZADD', KEYS[4], score, id)
    end
    redis.call('HSET', KEYS[1], 'priority', ARGV[8])
    extra[#extra + 1] = 'priority'
    extra[#extra + 1] = ARGV[8]
    wake_workers(KEYS[5], 1)
  end
end
journal(KEYS[2], now, 'merged', f[2], nil, nil, extra)
compact_journal(KEYS[2])
return 1
