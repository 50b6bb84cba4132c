-- A RUNNING job's lease: who may move it out of RUNNING, and what leaving it
-- takes. Every outcome script (complete, pause, suspend, retry, dead,
-- release, cancel by its worker) checks the owner, then leaves running.

-- @include journal.lua

-- The fields check_owner reads, in this order: f[1] state, f[2] lease_token,
-- f[3] run_count, f[4] slot (the concurrency slots its run holds, include
-- limits.lua; nil for none), f[5] lease_owner and f[6] claimed_at (the run's
-- claim, for the entry that ends it: with_claim). `more` fields follow from f[7].
--
-- A job's `hooks` field ('1') says its ending has more to do than its own
-- keys: a concurrency slot to give back (`slot`), an offload snapshot to
-- settle (`offload`, `offload_ttl`), dependents to tell (`dependents`). The
-- claim sets it with the run (it reads the whole hash anyway), and so does
-- enqueue_flow.lua for a job others come to wait on while it runs; complete,
-- the hot path, reads those four fields only for a job that has it.

-- A transition out of RUNNING refused (a stale lease token, a job in another
-- state): journaled, so `venturi job show` explains why a late outcome left
-- no trace; the only write a refused transition makes. Returns the reason,
-- or, when the journal itself cannot take the entry (a key of the wrong
-- type), that.
local function refuse(job_key, journal_key, state, reason, run, attempted, now)
  if not journal_ok(journal_key) then
    return 'journal key is not a stream'
  end
  -- A job never journaled (pending, untouched since enqueue): its `enqueued` entry first.
  materialize(job_key, journal_key)
  journal(journal_key, now, 'refused', run, reason, nil, {'attempted', attempted})
  if state ~= 'running' then
    compact_journal(journal_key)
  end
  return reason
end

-- Fencing: a transition out of RUNNING is allowed only for the holder of the
-- current lease token. Returns (nil, run_count, f) when allowed, or a reason
-- (its job or journal key of the wrong type is one too; a refusal is
-- journaled: refuse above). The caller writes nothing else when refused.
-- `more` (optional): further fields the caller needs, read in the same
-- HMGET, as f[7], f[8], ... (whatever the verdict). `pre_at` (optional): the
-- index in f of `created_at`, `priority` and `eligible_at`, in that order
-- (in `more`), which materialize then does not read again.
-- The fourth value returned, when the check passes: the journal's length
-- now (for compact_journal, which then need not read it).
-- `lib`: the caller's lib (a function returning a table of its helpers,
-- scripts.py prune), with `refuse` above in it: a refusal takes it from
-- there, so a script makes refuse's closure on that path only, not on
-- every call (benchmarks/README.md, "Session 24").
-- Every caller gets the job's `enqueued` entry written here, before its
-- first write to the hash (complete.lua, whose writes leave the hash saying
-- it, checks its own owner: lean_owner).
local function check_owner(job_key, journal_key, token, attempted, now, more, pre_at, lib)
  local f
  if more then
    f = redis.pcall('HMGET', job_key, 'state', 'lease_token', 'run_count', 'slot',
      'lease_owner', 'claimed_at', unpack(more))
  else
    f = redis.pcall('HMGET', job_key, 'state', 'lease_token', 'run_count', 'slot',
      'lease_owner', 'claimed_at')
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
  if f[1] ~= 'running' then
    return lib().refuse(job_key, journal_key, f[1], 'job is ' .. f[1], f[3], attempted, now), f[3], f
  elseif f[2] ~= token then
    return lib().refuse(job_key, journal_key, f[1],
      'lease token does not match (the lease expired and was reclaimed)', f[3], attempted, now), f[3], f
  end
  -- Its length also says whether the journal has entries (then materialize
  -- has nothing to write: its EXISTS is skipped).
  local len = journal_ok(journal_key)
  if not len then
    return 'journal key is not a stream', f[3]
  end
  if len == 0 and materialize(job_key, journal_key, pre_at and {f[pre_at], f[pre_at + 1], f[pre_at + 2]}) then
    len = 1
  end
  return nil, f[3], f, len
end

-- Clear the lease fields when a job leaves RUNNING (absent, not empty: a
-- field costs each retained hash ~15 B); the owner stays for forensics ("who
-- ran it last").
local function clear_lease(job_key)
  redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'claimed_at')
end

-- Leave RUNNING with the run's outcome: out of the running set, the lease
-- fields dropped (clear_lease's HDEL, inline: a helper named here would be a
-- closure made on every call of the scripts that end a run), the run's
-- attachment (msgpack; '' = none) set or dropped and its carry ('' =
-- unchanged) saved. The caller then writes the state.
local function leave_running(running_key, job_key, id, attachment, carry)
  redis.call('ZREM', running_key, id)
  if attachment == nil or attachment == '' then
    redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'claimed_at', 'attachment')
  else
    redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'claimed_at')
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
