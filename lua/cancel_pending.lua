-- cancel_pending: PENDING -> CANCELLED for many jobs at once, an operator's
-- bulk cancel (`queue.cancel_jobs()`, `venturi jobs cancel`): what cancel.lua
-- does to one pending job, for each of ids, with what the batch shares
-- written once per call (retry_dead.lua's treatment): one ZREM per pending
-- set, one from `retrying`, one ZADD to the cancelled set, one event-stream
-- entry (events.lua emit_many, with the note and `from` the jobs share).
--
-- KEYS[1..4] pending zsets, CRITICAL first (a job leaves them all: its
--         priority field is not trusted to name its set, as in cancel.lua)
-- KEYS[5] cancelled zset   KEYS[6] dedup index hash
-- KEYS[7] queue meta hash   KEYS[8] event stream (include events.lua)
-- KEYS[9] limits:parked zset: a job parked on a limit leaves it (limits.lua)
-- KEYS[10] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''
-- ARGV[2] key prefix of the queue (job hashes, journals, the `retrying`
--         index, the `dedup:held` set and offload snapshots derive from it)
-- ARGV[3] note (who cancelled, why)
-- ARGV[4..] job ids
--
-- A job this script does not cancel itself goes back to the caller, who
-- sends it cancel.lua on its own (calls_ops.py cancelled_pending): one in
-- another state cancel.lua acts on (running: a request; suspended; waiting:
-- it leaves the workflow graph), or a pending job on one of cancel.lua's
-- rare paths (holding or waiting on an order key, with dependents to tell).
-- Those paths write queue-wide keys that could refuse the write after the
-- batch's first ones; cancel.lua takes them one job a call, as before. An id
-- that is no job, or a finished one, is skipped. A job parked on a limit is
-- cancelled here: one ZREM from `limits:parked` for the batch's.
--
-- Each cancelled job gets what cancel.lua gives it: the `enqueued` entry
-- when it has no journal (a job never run: journal.lua materialize), then
-- its `cancelled` entry (from = pending), the journal compacted (the two
-- entries written to the queue's scratch stream and COPYed to the journal's
-- name at their exact size: journal.lua journal_add's start, for two), its
-- hash cancelled, its dedup key freed (a throttled job's look in
-- `dedup:held` with it: dedup.lua unhold), an offload's snapshot settled as
-- failed.
--
-- Errors: VR_WRONGTYPE when a pending set, the cancelled set or the
-- `retrying` index is not a sorted set (read before the first write:
-- nothing written).
--
-- Returns {n, id..., m, id..., refused_id, reason, ...}: the n ids
-- cancelled, the m ids for cancel.lua, then, for each id whose own data is
-- corrupt, the id and what is wrong (its job key not a hash, its journal not
-- a stream, no state field: operator.lua; a created_at that cannot date the
-- `enqueued` entry of a job with no journal; for a job with a dedup key, the
-- dedup index not a hash; for a parked job, `limits:parked` not a sorted
-- set). A refused job is left exactly as it was; the batch's other jobs go on.

-- @include clock.lua
-- @include keys.lua
-- @include journal.lua
-- @include dedup.lua
-- @include offload.lua
-- @include operator.lua

local prefix = ARGV[2]
local now = now_ms(ARGV[1])
local now_s = str(now) -- made text once for every write of the batch
local note = ARGV[3]
events_open(KEYS[7], KEYS[8], prefix)
local retrying = retrying_key(prefix)
-- The batch's set moves come after every job's own writes: their keys'
-- types are read before the first.
for _, key in ipairs({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], retrying}) do
  if type(redis.pcall('ZCARD', key)) == 'table' then
    return redis.error_reply('VR_WRONGTYPE ' .. key .. ' is not a sorted set')
  end
end
-- Read once per job, for every step below (cancel.lua's fields, the
-- `enqueued` entry's three, the offload token and the KIND for the event).
local FIELDS = {'state', 'run_count', 'dedup', 'dependents', 'parked', 'dedup_window', 'order_key',
  'created_at', 'priority', 'eligible_at', 'offload', 'kind'}
-- The states cancel.lua acts on that this script leaves to it.
local OTHERS = {running = true, suspended = true, waiting = true}
-- Each job's `cancelled` entry, made once (operator.lua batch_entry);
-- a job puts its journal key and run in place.
local ENTRY, ENTRY_RUN = batch_entry(now_s, 'cancelled', note, {'from', 'pending'})
local scratch = journal_scratch_key(prefix)
local compacts = JOURNAL_COMPACTS -- journal.lua compact_journal
local held = dedup_held_key(prefix)
local dedup_ok = nil -- whether the dedup index is a hash (or none): read at the first job with a key
local parked_ok = nil -- whether limits:parked is a sorted set (or none): read at the first parked job

-- The `enqueued` entry of a job with no journal (journal.lua write_enqueued)
-- into the scratch stream, alone there (MAXLEN = 1: whatever was left there
-- by hand goes).
local function scratch_enqueued(created, priority, eligible)
  return redis.pcall('XADD', scratch, 'MAXLEN', '=', '1', enqueued_id(created), 'event', 'enqueued',
    'at', created, 'run', '0', 'priority', priority or '', 'eligible_at', eligible or '')
end

-- A job never run has no journal (its hash has no run_count: journal.lua
-- materialize). Its journal is started with the `enqueued` entry and the
-- `cancelled` one at their exact size: both into the scratch stream, COPYed
-- to `journal_key` (cancel.lua's materialize, XADD and compact_journal: nine
-- commands, four here). Returns true when written; false when the
-- `enqueued` entry takes no stream id (a created_at too large: nothing
-- written); nil when the journal key exists after all (COPY never
-- overwrites), for the caller's plain path, which checks its type.
local function start_journal(journal_key, created, priority, eligible)
  if type(scratch_enqueued(created, priority, eligible)) == 'table' then
    -- A later id (or another type) left in the scratch by hand.
    redis.call('DEL', scratch)
    if type(scratch_enqueued(created, priority, eligible)) == 'table' then return false end
  end
  redis.call('XADD', scratch, 'MAXLEN', '=', '2', unpack(ENTRY, 7))
  local copied = redis.call('COPY', scratch, journal_key) == 1
  redis.call('DEL', scratch)
  if copied then return true end
  return nil
end

local done, others, refused = {}, {}, {}
local added = {} -- the cancelled set's ZADD: score, id, ...
local parked = {} -- the parked jobs' members of limits:parked
local kinds, runs = {}, {} -- the event's (events.lua emit_many)
for i = 4, #ARGV do
  local id = ARGV[i]
  local job_key, journal_key = job_keys(prefix, id)
  local f, corrupt = read_hash(job_key, FIELDS)
  local pending = false -- a job this script cancels
  if not corrupt then
    local state = f[1]
    if (state == 'pending' and (f[4] or f[7])) or OTHERS[state] then
      others[#others + 1] = id -- cancel.lua reads the job again, and refuses it if corrupt
    elseif state ~= 'pending' then
      -- Skipped, unless its journal is refused (as cancel.lua's read_job would).
      if not journal_ok(journal_key) then corrupt = 'journal key is not a stream' end
    else
      pending = true
      if f[3] and f[3] ~= '' and not f[6] then
        -- unindex's HGET: a dedup index of another type (made by hand)
        -- refuses the job before its first write (a throttled job's unhold
        -- reads it in a pcall).
        if dedup_ok == nil then dedup_ok = type(redis.pcall('HLEN', KEYS[6])) == 'number' end
        if not dedup_ok then corrupt = 'dedup index is not a hash' end
      end
      if f[5] and not corrupt then
        -- The batch's ZREM from limits:parked comes after its jobs' writes.
        if parked_ok == nil then parked_ok = type(redis.pcall('ZCARD', KEYS[9])) == 'number' end
        if not parked_ok then corrupt = KEYS[9] .. ' is not a sorted set' end
      end
    end
  end
  local started = nil
  if pending and not corrupt then
    -- The job's first write is its journal's, and it checks the journal.
    ENTRY[2], ENTRY[ENTRY_RUN] = journal_key, f[2] or '0'
    if not f[2] and compacts and is_time(f[8]) then started = start_journal(journal_key, f[8], f[9], f[10]) end
    if started == false then
      corrupt = 'created_at field is not a time'
    elseif not started then
      -- As cancel.lua: XADD NOMKSTREAM appends to a stream only (an error
      -- for a key of another type: refused, nothing written; nil for none:
      -- the `enqueued` entry first, materialize), then the compaction.
      local entry = redis.pcall(unpack(ENTRY))
      if type(entry) == 'table' then
        corrupt = 'journal key is not a stream'
      elseif not entry then
        -- A created_at no stream id takes fails the `enqueued` entry's XADD,
        -- nothing written: refused (Lua's pcall).
        if pcall(materialize, job_key, journal_key, {f[8], f[9], f[10]}) then
          redis.call('XADD', journal_key, unpack(ENTRY, 4)) -- the same, without NOMKSTREAM
        else
          corrupt = 'created_at field is not a time'
        end
      end
      if not corrupt then compact_journal(journal_key) end
    end
  end
  if corrupt then
    refused[#refused + 1] = id
    refused[#refused + 1] = corrupt
  elseif pending then
    if started then
      -- materialize's HSETNX: a pending job has a journal exactly when its hash has run_count.
      redis.call('HSET', job_key, 'state', 'cancelled', 'note', note, 'finished_at', now_s,
        'updated_at', now_s, 'run_count', '0')
    else
      redis.call('HSET', job_key, 'state', 'cancelled', 'note', note, 'finished_at', now_s,
        'updated_at', now_s)
    end
    if f[5] then
      redis.call('HDEL', job_key, 'eligible_at', 'parked')
      if f[5] ~= '' then parked[#parked + 1] = f[5] end -- limits.lua unpark
    else
      redis.call('HDEL', job_key, 'eligible_at')
    end
    if f[6] then
      unhold(KEYS[6], held, f[3], id) -- a throttled job: a look an earlier run left
    else
      unindex(KEYS[6], f[3], id)
    end
    if f[11] and f[11] ~= '' then
      offload_settle(prefix, job_key, id, 'failed', nil, 'cancelled: ' .. note, now_s)
    end
    done[#done + 1] = id
    added[#added + 1] = now_s
    added[#added + 1] = id
    kinds[#kinds + 1] = f[12] or ''
    runs[#runs + 1] = f[2] or '0'
  end
end
if #done > 0 then
  for k = 1, 4 do each_chunk('ZREM', KEYS[k], done) end
  each_chunk('ZREM', retrying, done) -- waiting for a retry, maybe (keys.lua)
  each_chunk('ZADD', KEYS[5], added)
  if #parked > 0 then each_chunk('ZREM', KEYS[9], parked) end
  if events_stream then emit_many('cancelled', now_s, done, kinds, runs, {'from', 'pending'}, note) end
end
local out = {#done}
for _, v in ipairs(done) do out[#out + 1] = v end
out[#out + 1] = #others
for _, v in ipairs(others) do out[#out + 1] = v end
for _, v in ipairs(refused) do out[#out + 1] = v end
return out
