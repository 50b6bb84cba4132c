-- Helpers shared by every transition script. Expanded once, ahead of the script
-- body, by venturi_redis/_scripts.py.

-- Redis's Lua (5.1) turns a number into a string, for redis.call or `..`,
-- with sprintf("%.14g"). That was the largest single cost in these scripts:
-- 15 conversions per job lifecycle took ~11% of Redis's instructions per job
-- (callgrind, claim + complete). The numbers we write are integers (ms
-- timestamps, counts), and '%d' formats those several times faster. Hot paths
-- convert each value once and pass the string on; `str` leaves strings alone.
-- Integers only: '%d' would drop a fraction.
local format = string.format
local function str(x)
  if type(x) == 'number' then
    return format('%d', x)
  end
  return x
end

-- The one clock: the caller's milliseconds when given (tests, or a deployment
-- that wants its own clock), otherwise Redis TIME read once at the top.
local function now_ms(arg)
  if arg ~= nil and arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  -- Lua turns TIME's two strings into numbers for the arithmetic itself.
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- Journals are capped so a job that pauses forever cannot grow without bound.
-- (A string: XADD takes it as one, see `str`.)
local JOURNAL_MAXLEN = '1000'

-- Append one journal entry. `extra` is a flat list of field, value pairs.
local function journal(key, at, event, run, note, attachment, extra)
  local args = {'XADD', key, 'MAXLEN', '~', JOURNAL_MAXLEN, '*',
                'event', event, 'at', str(at), 'run', str(run or 0)}
  if note ~= nil and note ~= false and note ~= '' then
    args[#args + 1] = 'note'
    args[#args + 1] = note
  end
  if attachment ~= nil and attachment ~= false and attachment ~= '' then
    args[#args + 1] = 'attachment'
    args[#args + 1] = attachment
  end
  if extra then
    for i = 1, #extra do
      args[#args + 1] = extra[i]
    end
  end
  return redis.call(unpack(args))
end

-- A stream's first node is allocated at 4 KB on Redis 7 (t_stream.c
-- preallocates up to stream-node-max-bytes for the XADDs to come), about six
-- times what a job's journal holds. A job that leaves a worker for a state it
-- may keep for long (finished, dead, cancelled, paused, suspended, waiting out
-- a backoff, pending again) gets its journal rewritten through DUMP and
-- RESTORE ... REPLACE, which loads the node at its exact size: ~4.7 KB ->
-- ~0.8 KB. The entries, their ids, the stream's last id and its TTL are
-- unchanged; a later XADD grows the node in place. A journal longer than one
-- node (100 entries by default) is left alone: its full nodes were shrunk by
-- Redis already, and the copy would cost more. Skipped where the server does
-- not give its version to scripts (fakeredis: no preallocation to undo, and
-- its DUMP is not Redis's).
local JOURNAL_COMPACT_MAX = 100
local function compact_journal(key)
  if redis.REDIS_VERSION_NUM == nil then
    return
  end
  local len = redis.call('XLEN', key)
  if len == 0 or len > JOURNAL_COMPACT_MAX then
    return
  end
  local ttl = redis.call('PTTL', key)
  local blob = redis.call('DUMP', key)
  redis.call('RESTORE', key, ttl > 0 and str(ttl) or '0', blob, 'REPLACE')
end

-- The id of a job's `enqueued` entry: its created_at, sequence 0 (0-0 is not
-- a valid stream id, so a job created at 0 gets 0-1). _records.py
-- (enqueued_entry) synthesizes the same id for a job with no stream yet.
local function enqueued_id(created)
  if tonumber(created) == 0 then
    return '0-1'
  end
  return created .. '-0'
end

-- Enqueue writes no journal (a one-entry stream costs ~4.7 KB on Redis 7.0);
-- the stream is created by the job's first journaled event after enqueue.
-- Call this before that event, and before any write to the job's hash:
-- when the stream does not exist yet it first writes the `enqueued` entry
-- exactly as enqueue used to (from the hash's created_at, priority and
-- eligible_at, so their enqueue-time values). `pre` is optional: those three
-- fields already read by the caller, in that order. A stream that exists is
-- never touched, so the explicit id cannot collide; later `*` ids are greater.
-- Returns true when it wrote the entry (the stream is then that entry
-- alone), nil when it wrote nothing.
local function materialize(job_key, journal_key, pre)
  if redis.call('EXISTS', journal_key) == 1 then
    return nil
  end
  local f = pre or redis.call('HMGET', job_key, 'created_at', 'priority', 'eligible_at')
  if not f[1] then
    return nil
  end
  local id = enqueued_id(f[1])
  local fields = {'event', 'enqueued', 'at', f[1], 'run', '0', 'priority', f[2] or '',
    'eligible_at', f[3] or ''}
  redis.call('XADD', journal_key, 'MAXLEN', '~', JOURNAL_MAXLEN, id, unpack(fields))
  return true
end

-- Set a msgpack blob field, or drop it when the caller sent nothing.
local function set_blob(job_key, field, value)
  if value == nil or value == '' then
    redis.call('HDEL', job_key, field)
  else
    redis.call('HSET', job_key, field, value)
  end
end

-- Fencing: a transition out of RUNNING is allowed only for the holder of the
-- current lease token. Returns (nil, run_count) when allowed, or a reason.
-- A refusal is journaled so `venturi job show` explains why a late outcome
-- left no trace. This is the only write before the precondition fails.
-- `more` (optional): further fields the caller needs, read in the same HMGET
-- and returned third, as f[4], f[5], ... (the job's fields, whatever the verdict).
local function check_owner(job_key, journal_key, token, attempted, now, more)
  local f
  if more then
    f = redis.call('HMGET', job_key, 'state', 'lease_token', 'run_count', unpack(more))
  else
    f = redis.call('HMGET', job_key, 'state', 'lease_token', 'run_count')
  end
  if not f[1] then
    return 'job does not exist', 0
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

-- Dedup policy when a job comes back to pending (pause, retry, release,
-- reclaim, resume): it takes its key back if no other pending job holds it;
-- otherwise the index keeps pointing at the holder and this job runs as its
-- own row, no longer a merge candidate.
local function reindex(dedup_key, job_key, id)
  local field = redis.call('HGET', job_key, 'dedup')
  if field and field ~= '' then
    redis.call('HSETNX', dedup_key, field, id)
  end
end

-- Drop the index entry of a job leaving pending, if the entry is its own.
local function unindex(dedup_key, field, id)
  if field and field ~= '' and redis.call('HGET', dedup_key, field) == id then
    redis.call('HDEL', dedup_key, field)
  end
end

-- Clear the lease fields when a job leaves RUNNING (absent, not empty: a
-- field costs each retained hash ~15 B); the owner stays for forensics ("who
-- ran it last").
local function clear_lease(job_key)
  redis.call('HDEL', job_key, 'lease_token', 'lease_expires')
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

-- Wake idle workers: push one token per job made claimable onto the queue's
-- wake list (`prefix .. 'wake'`). An idle worker blocks on that list with
-- BLPOP, its claim pipelined behind (docs/design.md, "Waking workers"), so a
-- token wakes exactly one worker and a job pushed while no worker listened
-- is not lost. A worker whose claim comes back short deletes the list (every
-- token in it is stale by then); the cap bounds it when no worker runs.
local WAKE_CAP = 1024
local function wake_workers(key, n)
  -- Tokens beyond the cap are not pushed (an LTRIM after the push cost
  -- more than the rest of a one-job enqueue while no worker drained them).
  local room = WAKE_CAP - redis.call('LLEN', key)
  if n > room then n = room end
  if n < 1 then return end
  local tokens = {}
  for i = 1, n do tokens[i] = '1' end
  redis.call('RPUSH', key, unpack(tokens))
end
