-- An operator's transition of one job (cancel, resume, retry_dead, merge):
-- the job's own data is checked before the first write, and a job whose data
-- is corrupt is refused with nothing written, whatever its state. The claim
-- and the reclaim quarantine such a job when they meet it (quarantine.lua);
-- an operator acting on it learns what is wrong instead (a VR_CORRUPTJOB
-- error reply, or a batch's refusal list), and may repair it first.
-- docs/guarantees.md states the rule; tests/test_quarantine_ops.py tries each case.

-- @include journal.lua
-- @include states.lua

-- The job's fields (an HMGET of `fields`, whose first must be 'state'), or
-- nil and what is wrong with its hash: a key that is not a hash, a hash
-- with fields but no state, or a state that is none. A job with no hash at
-- all comes back as fields with f[1] nil: the caller's "does not exist".
-- The journal is the caller's to check (read_job below; retry_dead.lua's
-- XADD NOMKSTREAM checks it with its write).
local function read_hash(job_key, fields)
  local f = redis.pcall('HMGET', job_key, unpack(fields))
  if f.err then
    return nil, 'job key is not a hash'
  end
  if not f[1] and redis.call('EXISTS', job_key) == 1 then
    return nil, 'state field is missing'
  end
  if f[1] and not JOB_STATES[f[1]] then
    return nil, 'state field "' .. string.sub(f[1], 1, 64) .. '" is not a job state'
  end
  return f, nil
end

-- read_hash's fields and checks, and the journal's: a journal key that is
-- not a stream is refused too.
local function read_job(job_key, journal_key, fields)
  local f, corrupt = read_hash(job_key, fields)
  if corrupt then
    return nil, corrupt
  end
  if not journal_ok(journal_key) then
    return nil, 'journal key is not a stream'
  end
  return f, nil
end

-- The coded error reply of a refused job (calls.py script_error:
-- CorruptQueueError), for the scripts that act on one job.
local function corrupt_job(id, what)
  return redis.error_reply('VR_CORRUPTJOB job ' .. id .. ': ' .. what)
end

-- A bulk action's journal entry, the same for every job of the batch
-- (journal.lua journal_args), made once: the XADD's arguments with
-- NOMKSTREAM third, and the index of the run's value. Each job puts its
-- journal key (args[2]) and its run in place.
local function batch_entry(now_s, event, note, extra)
  local args = journal_args('', now_s, event, '0', note, nil, extra)
  table.insert(args, 3, 'NOMKSTREAM')
  for k = 1, #args do
    if args[k] == 'run' then
      return args, k + 1
    end
  end
end

-- `cmd key` with all of `list`, or `cmd` with all of `list` when `key` is
-- nil (a DEL of many keys), in chunks: unpack takes a few thousand values at
-- most. The bulk actions' set moves (retry_dead, cancel_pending, purge), once
-- per call.
local function each_chunk(cmd, key, list)
  for j = 1, #list, 1000 do
    if key then
      redis.call(cmd, key, unpack(list, j, math.min(j + 999, #list)))
    else
      redis.call(cmd, unpack(list, j, math.min(j + 999, #list)))
    end
  end
end
