-- The job's journal (a stream): appending, compacting, and the `enqueued`
-- entry that enqueue leaves for the job's first journaled event to write.

-- @include clock.lua
-- @include events.lua

-- Journals are capped so a job that pauses forever cannot grow without bound.
-- (A string: XADD takes it as one, see `str`.)
local JOURNAL_MAXLEN = '1000'

-- Whether a job's journal can take an entry: a stream, or no key yet. Read
-- (one TYPE) before any write for a RUNNING job by the scripts that journal
-- it (lease.lua check_owner, reclaim), so a journal overwritten by hand
-- (`SET journal:<id> x`) is refused or quarantined, the job's fault alone,
-- not an XADD error half way through a transition or a batch.
local function journal_ok(journal_key)
  local t = redis.call('TYPE', journal_key).ok
  return t == 'stream' or t == 'none'
end

-- Append one journal entry. `extra` is a flat list of field, value pairs.
-- The entry is also the queue's event (events.lua), when events are on.
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
  local entry = redis.call(unpack(args))
  if events_stream then
    -- The entry's event (events.lua): the job's id is the journal key's tail
    -- (ARGV[2], the prefix, .. 'journal:' .. id, keys.lua), its kind read
    -- from the job's hash.
    local id = string.sub(key, #ARGV[2] + 9)
    local kind = redis.pcall('HGET', job_keys(ARGV[2], id), 'kind')
    if type(kind) ~= 'string' then kind = '' end -- none, or a quarantined job's broken key
    emit(id, kind, event, at, run, note, extra)
  end
  return entry
end

-- `extra` with a failed run's exception type and traceback tail appended
-- (each only when given: '' is none). The worker bounds the traceback's size.
local function with_error(extra, error_type, traceback)
  if error_type ~= nil and error_type ~= '' then
    extra[#extra + 1] = 'error_type'
    extra[#extra + 1] = error_type
  end
  if traceback ~= nil and traceback ~= '' then
    extra[#extra + 1] = 'traceback'
    extra[#extra + 1] = traceback
  end
  return extra
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

-- A `created_at` that can be the id of the `enqueued` entry: digits only.
local function is_time(value)
  return value ~= nil and value ~= false and string.match(value, '^%d+$') ~= nil
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
-- alone), nil when it wrote nothing. write_enqueued is its write, for a
-- caller that checked the stream and created_at itself (claim.lua).
local function write_enqueued(journal_key, f)
  local id = enqueued_id(f[1])
  local fields = {'event', 'enqueued', 'at', f[1], 'run', '0', 'priority', f[2] or '',
    'eligible_at', f[3] or ''}
  redis.call('XADD', journal_key, 'MAXLEN', '~', JOURNAL_MAXLEN, id, unpack(fields))
end

local function materialize(job_key, journal_key, pre)
  if redis.call('EXISTS', journal_key) == 1 then
    return nil
  end
  local f = pre or redis.call('HMGET', job_key, 'created_at', 'priority', 'eligible_at')
  if not is_time(f[1]) then
    return nil -- no created_at to date it (a corrupt one: see quarantine.lua)
  end
  write_enqueued(journal_key, f)
  return true
end
