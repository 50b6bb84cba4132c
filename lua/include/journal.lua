-- The job's journal (a stream): appending, compacting, and the entries the
-- job's hash still implies (docs/redis-layout.md, "The journal").
--
-- A journal holds what the job's hash cannot say. What it can is not written
-- twice (each XADD is Redis work on every job, and a stream's first node
-- costs 4 KB until compacted):
-- * the `enqueued` entry: enqueue writes no journal; the hash's created_at,
--   priority and eligible_at are what that entry says until a script changes
--   one of them, and such a script writes it first (materialize below). A
--   job that completes on its first run never has it written;
-- * a run's `claimed` entry: the claim writes no journal; the hash holds the
--   run while it runs (run_count, lease_owner, claimed_at), and the entry that
--   ends the run carries them (`worker`, `claimed_at`, with_claim below).
-- Readers put both back (_model/records.py, journal_from): `queue.journal()`,
-- `venturi job show`, the dashboard and ctx.history show every entry.

-- @include clock.lua
-- @include events.lua

-- Journals are capped so a job that pauses forever cannot grow without bound.
-- (A string: XADD takes it as one, see `str`.)
local JOURNAL_MAXLEN = '1000'

-- Whether a job's journal can take an entry: a stream, or no key yet. Read
-- before any write for a RUNNING job by the scripts that journal it on their
-- cold paths (lease.lua check_owner, reclaim), so a journal overwritten by hand
-- (`SET journal:<id> x`) is refused or quarantined, the job's fault alone,
-- not an XADD error half way through a transition or a batch. (XLEN: an
-- error for a key of another type, 0 for none; TYPE's status reply costs
-- Redis three times as much.) Returns the journal's length (0 for none, a
-- true value in Lua), or false when it cannot take an entry.
local function journal_ok(journal_key)
  local len = redis.pcall('XLEN', journal_key)
  return type(len) == 'number' and len
end

-- The XADD of one entry; `extra` a flat list of field, value pairs.
local function journal_args(key, at, event, run, note, attachment, extra)
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
  return args
end

-- Append one journal entry; it is also the queue's event (events.lua) when
-- events are on: the job's id is the journal key's tail (ARGV[2], the
-- prefix, .. 'journal:' .. id, keys.lua), its kind read from the job's hash
-- (or `kind`, when the caller read it anyway: a batch saves a read per job).
local function journal(key, at, event, run, note, attachment, extra, kind)
  local entry = redis.call(unpack(journal_args(key, at, event, run, note, attachment, extra)))
  if events_stream then
    local id = string.sub(key, #ARGV[2] + 9)
    if kind == nil then kind = redis.pcall('HGET', job_keys(ARGV[2], id), 'kind') end
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

-- `extra` with the claim of the run it ends: its worker and claim time, from
-- the job's hash (`owner`: lease_owner, `claimed`: claimed_at). The entry
-- that ends a run carries them, since the claim writes no `claimed` entry.
-- A run claimed by a release before 0.2 has no claimed_at: its claim is an
-- entry of its own already.
local function with_claim(extra, owner, claimed)
  if claimed then
    extra[#extra + 1] = 'worker'
    extra[#extra + 1] = owner or ''
    extra[#extra + 1] = 'claimed_at'
    extra[#extra + 1] = claimed
  end
  return extra
end

-- Whether journals are compacted (compact_journal, journal_add): on every
-- Redis and Valkey, whose streams preallocate their first node (6.2 as 7.x
-- and 8), not on fakeredis (memory://), which has nothing to undo. Told
-- apart by redis.sha1hex, which every release gives scripts and fakeredis
-- does not; never by redis.REDIS_VERSION_NUM, which Redis 6.2 lacks (7.0+).
local JOURNAL_COMPACTS = redis.sha1hex ~= nil

-- A stream's first node is allocated at 4 KB on Redis 6.2 and later (t_stream.c
-- preallocates up to stream-node-max-bytes for the XADDs to come), about six
-- times what a job's journal holds. A job whose journal was just started and
-- that may stay for long (finished, dead, cancelled, suspended, waiting out a
-- backoff) gets it copied at its exact size: COPY duplicates a stream's nodes
-- at their used size (~4.7 KB -> ~0.8 KB). RENAME to a scratch key of the
-- queue, COPY back, DEL the scratch: three commands every user may run (no
-- @dangerous one: RESTORE is, and an application's ACL user
-- seldom has it). The entries, their ids, the stream's last id and its TTL
-- are unchanged (COPY keeps a TTL); a later XADD grows the node in place. A
-- journal longer than one node (100 entries by default) is left alone: its
-- full nodes were shrunk by Redis already, and the copy would cost more.
-- Skipped on fakeredis (JOURNAL_COMPACTS: no preallocation to undo). `len`:
-- the stream's length when the caller knows it (nil: read here).
local JOURNAL_COMPACT_MAX = 100
local function compact_journal(key, len)
  if not JOURNAL_COMPACTS then
    return
  end
  len = len or redis.call('XLEN', key)
  if len == 0 or len > JOURNAL_COMPACT_MAX then
    return
  end
  local scratch = journal_scratch_key(ARGV[2])
  redis.call('RENAME', key, scratch)
  redis.call('COPY', scratch, key)
  redis.call('DEL', scratch)
end

-- Append the entry `...` (its field, value pairs) to a journal, one that
-- it starts when `starts` (a first run's completion, the usual job's first
-- and only entry; else a plain XADD). A start is compact_journal's
-- result at one command less: the entry goes to the queue's scratch key
-- (MAXLEN = 1: the scratch holds that entry alone whatever was left there by
-- hand), COPY puts it at the journal's name at its exact size and the scratch
-- goes. A journal that exists already (COPY never overwrites: entries written
-- before, e.g. a refusal's) gets the entry itself and is compacted as before.
-- The fields come as arguments, not as journal_args's table: building and
-- unpacking a table of 16 values per job cost Redis more than the XADD
-- itself (redis_cost.py: -8% of a drain's instructions).
-- Returns what XADD returns (an error table: a journal of the wrong type,
-- nothing written).
local journal_add_scratch = nil -- journal_scratch_key(ARGV[2]), made once per call
local function journal_add(key, starts, ...)
  if not starts or not JOURNAL_COMPACTS then
    return redis.pcall('XADD', key, 'MAXLEN', '~', JOURNAL_MAXLEN, '*', ...)
  end
  local scratch = journal_add_scratch or journal_scratch_key(ARGV[2])
  journal_add_scratch = scratch
  local entry = redis.pcall('XADD', scratch, 'MAXLEN', '=', '1', '*', ...)
  if type(entry) == 'string' and redis.call('COPY', scratch, key) == 1 then
    redis.call('DEL', scratch)
    return entry
  end
  redis.call('DEL', scratch)
  entry = redis.pcall('XADD', key, 'MAXLEN', '~', JOURNAL_MAXLEN, '*', ...)
  if type(entry) == 'string' then compact_journal(key) end
  return entry
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

-- Write the `enqueued` entry exactly as enqueue would have (from the hash's
-- created_at, priority and eligible_at, so their enqueue-time values), at
-- its explicit id. `f`: those three fields. Only into a stream that does not
-- exist yet: a later `*` id is always greater.
local function write_enqueued(journal_key, f)
  local id = enqueued_id(f[1])
  local fields = {'event', 'enqueued', 'at', f[1], 'run', '0', 'priority', f[2] or '',
    'eligible_at', f[3] or ''}
  redis.call('XADD', journal_key, 'MAXLEN', '~', JOURNAL_MAXLEN, id, unpack(fields))
end

-- Before a script changes a job's priority or eligible_at, or writes its
-- journal's first entry on a cold path: the `enqueued` entry, when the job
-- has no journal yet (its hash still says it). Call it before any write to
-- the job's hash. `pre` is optional: those three fields already read by the
-- caller, in that order. Returns true when it wrote the entry (the stream is
-- then that entry alone), nil when it wrote nothing.
-- A job never run gets `run_count` 0 with it: a pending job has a journal
-- exactly when its hash has run_count, so the claim reads the journal (the
-- run's ctx.history) only then, and most first claims skip the read.
local function materialize(job_key, journal_key, pre)
  if redis.call('EXISTS', journal_key) == 1 then
    return nil
  end
  local f = pre or redis.call('HMGET', job_key, 'created_at', 'priority', 'eligible_at')
  if not is_time(f[1]) then
    return nil -- no created_at to date it (a corrupt one: see quarantine.lua)
  end
  write_enqueued(journal_key, f)
  redis.call('HSETNX', job_key, 'run_count', '0')
  return true
end
