-- A RUNNING job's lease: who may move it out of RUNNING, and what leaving it
-- takes. Every outcome script (pause, suspend, retry, dead, release, cancel
-- by its worker) checks the owner, then leaves running.

-- @include journal.lua

-- Fencing: a transition out of RUNNING is allowed only for the holder of the
-- current lease token. Returns (nil, run_count) when allowed, or a reason
-- (its job or journal key of the wrong type is one too).
-- A refusal is journaled so `venturi job show` explains why a late outcome
-- left no trace. This is the only write before the precondition fails.
-- The job's fields come back third: f[4] is its `slot` (the concurrency slots
-- its run holds, include limits.lua; nil for none); `more` (optional): further
-- fields the caller needs, read in the same HMGET, as f[5], f[6], ...
-- (whatever the verdict).
local function check_owner(job_key, journal_key, token, attempted, now, more)
  local f
  if more then
    f = redis.pcall('HMGET', job_key, 'state', 'lease_token', 'run_count', 'slot', unpack(more))
  else
    f = redis.pcall('HMGET', job_key, 'state', 'lease_token', 'run_count', 'slot')
  end
  -- A job or journal key overwritten by hand: refused with nothing written
  -- (a batch's other jobs go on); the job stays in running, and at its
  -- lease's expiry the reclaim quarantines it (quarantine.lua).
  if f.err then
    return 'job key is not a hash', 0
  end
  if not f[1] then
    return 'job does not exist', 0
  end
  if not journal_ok(journal_key) then
    return 'journal key is not a stream', f[3]
  end
  local reason = nil
  if f[1] ~= 'running' then
    reason = 'job is ' .. f[1]
  elseif f[2] ~= token then
    reason = 'lease token does not match (the lease expired and was reclaimed)'
  end
  if reason then
    -- A stale token for a job never journaled (pending, untouched since enqueue).
    materialize(job_key, journal_key)
    journal(journal_key, now, 'refused', f[3], reason, nil, {'attempted', attempted})
    if f[1] ~= 'running' then
      compact_journal(journal_key)
    end
  end
  return reason, f[3], f
end

-- Clear the lease fields when a job leaves RUNNING (absent, not empty: a
-- field costs each retained hash ~15 B); the owner stays for forensics ("who
-- ran it last").
local function clear_lease(job_key)
  redis.call('HDEL', job_key, 'lease_token', 'lease_expires')
end

-- Leave RUNNING with the run's outcome: out of the running set, the lease
-- fields dropped, the run's attachment (msgpack; '' = none) set or dropped
-- and its carry ('' = unchanged) saved. The caller then writes the state.
local function leave_running(running_key, job_key, id, attachment, carry)
  redis.call('ZREM', running_key, id)
  if attachment == nil or attachment == '' then
    redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'attachment')
  else
    clear_lease(job_key)
    redis.call('HSET', job_key, 'attachment', attachment)
  end
  if carry ~= nil and carry ~= '' then
    redis.call('HSET', job_key, 'carry', carry)
  end
end

-- max_failures of a job: its own override, else the worker's default;
-- 'none' (either side) disables the backstop. Returns nil when disabled.
local function backstop(job_value, default_value)
  local v = job_value
  if v == nil or v == false or v == '' then
    v = default_value
  end
  if v == nil or v == '' or v == 'none' then
    return nil
  end
  return tonumber(v)
end

-- Set a msgpack blob field, or drop it when the caller sent nothing.
local function set_blob(job_key, field, value)
  if value == nil or value == '' then
    redis.call('HDEL', job_key, field)
  else
    redis.call('HSET', job_key, field, value)
  end
end
