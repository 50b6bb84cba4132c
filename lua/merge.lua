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
-- KEYS[9] dedup index hash   KEYS[10] dedup:held zset (keys.lua dedup_held_key)
-- KEYS[11] retrying zset: a job waiting for its retry (keys.lua retrying_key)
--         is due at its new eligible_at there too, when a debounce moves it
-- KEYS[12] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[10] the job's dedup field
-- ARGV[11] debounce in ms ('' = none): the merged job's eligibility moves to
--         now + this, whatever the decision (a parked job goes back to its
--         pending set, KEYS[4], for the claim to park again when due)
--
-- Decision `check`, for a holder the client read out of pending: is the key
-- still held by it? A throttled job (docs/dedup.md) holds it while it runs
-- and until its `dedup_until` once completed (its `dedup:held` score when its
-- hash was trimmed). Returns 2 when it is (the enqueue returns its id, nothing
-- written); otherwise the index entry, if still this job's, is dropped and 0
-- returned (the client tries the create again).
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
-- @include dedup.lua

local id = ARGV[3]
local f, corrupt = read_job(KEYS[1], KEYS[2], {'state', 'run_count', 'priority', 'parked', 'dedup_window',
  'dedup_until', 'failures'})
if corrupt then
  return corrupt_job(id, corrupt)
end
if ARGV[4] == 'check' then
  if f[1] == 'pending' then return 0 end -- a merge candidate again: the client reads it anew
  -- The index and the held set are read before the one write (HDEL).
  local holder = redis.pcall('HGET', KEYS[9], ARGV[10])
  if holder ~= id then return 0 end
  local now = now_ms(ARGV[1])
  local until_ms = nil
  if f[1] == 'completed' then
    until_ms = tonumber(f[6] or '')
  elseif not f[1] then
    local score = redis.pcall('ZSCORE', KEYS[10], ARGV[10])
    until_ms = type(score) == 'string' and tonumber(score) or nil
  end
  if (f[1] == 'running' and f[5]) or (until_ms and until_ms > now) then
    return 2
  end
  unindex(KEYS[9], ARGV[10], id)
  return 0
end
if f[1] ~= 'pending' then
  return 0
end
-- Journal the `enqueued` entry first if nothing has yet, while the hash still
-- holds the enqueue-time priority.
materialize(KEYS[1], KEYS[2])
local now = now_ms(ARGV[1])
local now_s = str(now) -- the writes' string, made once (clock.lua str)
events_open(KEYS[6], KEYS[7], ARGV[2])
local decision = ARGV[4]
local extra = {'decision', decision, 'by', ARGV[9]}
if decision ~= 'keep' then
  redis.call('HSET', KEYS[1], 'payload', ARGV[5], 'updated_at', now_s)
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
if ARGV[11] ~= '' then
  -- Debounce: eligible again only once the burst is quiet.
  local eligible = str(now + tonumber(ARGV[11]))
  if f[4] then
    -- Parked on a limit (its member may have just moved to the new level).
    limits_lib().unpark(KEYS[8], redis.call('HGET', KEYS[1], 'parked'))
    redis.call('HDEL', KEYS[1], 'parked')
  end
  redis.call('ZADD', KEYS[4], eligible, id)
  -- Waiting for its retry (only a job that has failed can be): its due time
  -- in the `retrying` index moves with it (XX: a job not in it stays out).
  -- An index only: its type does not stop the merge (as update.lua).
  if f[7] then redis.pcall('ZADD', KEYS[11], 'XX', eligible, id) end
  redis.call('HSET', KEYS[1], 'eligible_at', eligible)
  extra[#extra + 1] = 'eligible_at'
  extra[#extra + 1] = eligible
end
journal(KEYS[2], now_s, 'merged', f[2], nil, nil, extra)
compact_journal(KEYS[2])
return 1
