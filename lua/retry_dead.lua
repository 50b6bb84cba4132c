-- retry_dead: DEAD -> PENDING for an operator (`venturi job retry`,
-- `venturi dead retry`). The failure count restarts at 0, so the retry
-- backstop gives the job its full budget again; the old count is journaled.
-- A start deadline (`expires_at`, enqueue(expires=...)) is dropped: the
-- operator's retry is the decision to run the job now, and an expired job
-- kept it would only expire again (docs/semantics.md).
--
-- KEYS[1] dead zset   KEYS[2] dedup index hash   KEYS[3] wake list
-- KEYS[4..7] pending zsets, CRITICAL first: each job's priority field picks one
-- KEYS[8] queue meta hash   KEYS[9] event stream (include events.lua)
-- KEYS[10] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''
-- ARGV[2] key prefix of the queue (job hashes, journals and offload
--         snapshots derive from it)
-- ARGV[3] note
-- ARGV[4..] job ids
--
-- A retried job with an order key joins its key again as a new job would
-- (order.lua): it holds the key when the key is free, else waits at the end
-- of the key's queue. A damaged order key refuses it (nothing written).
--
-- Each job's `retried` journal entry keeps its failure count before
-- (`failures_before`); the queue's event stream gets one entry for the
-- call's jobs (events.lua emit_many, with the note they share), as a claim
-- or a batch of completions does.
--
-- A retried `@vr.offload` job's snapshot becomes `pending` again in the
-- same step, without its expiry (include offload.lua), so resolve() and
-- read_result report the rerun, not the old failure.
--
-- Errors: VR_WRONGTYPE when the dead set or the `retrying` index is not a
-- sorted set (nothing written).
--
-- Returns {retried, id..., refused_id, reason, ...}: the count and ids moved
-- to pending, then, for each id whose own data is corrupt, the id and what
-- is wrong (its job key not a hash, its journal not a stream, no state field:
-- operator.lua; a priority that names no pending set; a created_at that
-- cannot date the `enqueued` entry of a job with no journal; or, for a job
-- with a dedup key, the queue's dedup index not a hash; its pending set not
-- a sorted set). A refused job is left
-- exactly as it was, and the batch's other jobs go on: it was checked before
-- any write of its own (before, a journal that was not a stream failed the
-- XADD after the job's move, aborting the rest of the batch). An id that is
-- not a dead job of this queue (unknown, already retried, purged) is skipped.

-- @include clock.lua
-- @include keys.lua
-- @include journal.lua
-- @include dedup.lua
-- @include wake.lua
-- @include offload.lua
-- @include operator.lua
-- @include order.lua

local prefix = ARGV[2]
local now = now_ms(ARGV[1])
-- Every write of the batch takes the same time: made text once (a number
-- given to redis.call is formatted with "%.17g" on each use).
local now_s = str(now)
local note = ARGV[3]
events_open(KEYS[8], KEYS[9], prefix)
local moved = {} -- the ids moved to pending
local refused = {}
-- What the batch's jobs share is written once for all of them, after the
-- loop (each command a script calls costs Redis more than its own work):
-- one ZREM from the dead set, one from `retrying`, one ZADD per pending set,
-- one event. Nothing in the loop reads those keys, and the script is atomic.
local pending_of = {} -- pending set -> {score, id, ...}
local kinds, runs = {}, {} -- the `retried` event's (events.lua emit_many)
-- Read once, for every step below (a batch of thousands pays each read per job):
-- the dedup field (reindex), the offload token and the KIND (the event).
local FIELDS = {'state', 'priority', 'run_count', 'failures', 'dedup', 'offload', 'kind', 'order_key'}
-- Each job's `retried` entry, made once (operator.lua batch_entry); a job
-- puts its journal key, run and failure count before in place.
local XADD, XADD_RUN = batch_entry(now_s, 'retried', note, {'failures_before', '0'})
local dedup_ok = nil -- whether the dedup index is a hash (or none): read at the first job with a key
-- Those set moves come after every job's own writes, so their keys' types
-- are read before the first: a dead set or `retrying` index of another type
-- (made by hand) stops the call with nothing written; a pending set of
-- another type refuses the jobs it would take (read once each, at its first).
for _, key in ipairs({KEYS[1], retrying_key(prefix)}) do
  if type(redis.pcall('ZCARD', key)) == 'table' then
    return redis.error_reply('VR_WRONGTYPE ' .. key .. ' is not a sorted set')
  end
end
local set_ok = {} -- pending set -> whether it is a sorted set (or none)
for i = 4, #ARGV do
  local id = ARGV[i]
  local job_key, journal_key = job_keys(prefix, id)
  local f, corrupt = read_hash(job_key, FIELDS)
  local pending = nil
  local ok = nil
  if not corrupt and f[1] ~= 'dead' then
    -- Skipped, unless its journal is refused (as read_job would).
    if not journal_ok(journal_key) then corrupt = 'journal key is not a stream' end
  elseif not corrupt then
    pending = pending_key(4, f[2])
    if not pending then
      corrupt = bad_priority(f[2])
    elseif f[8] then
      ok = order_lib(feature_keys, graph_queue_keys, job_keys).keys(prefix)
      corrupt = order_lib(feature_keys, graph_queue_keys, job_keys).broken(ok)
    end
  end
  if pending and not corrupt then
    if set_ok[pending] == nil then set_ok[pending] = type(redis.pcall('ZCARD', pending)) == 'number' end
    if not set_ok[pending] then corrupt = pending .. ' is not a sorted set' end
  end
  if pending and not corrupt and f[5] and f[5] ~= '' then
    -- reindex's HSETNX below: a dedup index of another type (made by hand)
    -- refuses the job before its first write instead of failing the call
    -- half way, the batch's set moves (after the loop) not yet written.
    if dedup_ok == nil then dedup_ok = type(redis.pcall('HLEN', KEYS[2])) == 'number' end
    if not dedup_ok then corrupt = 'dedup index is not a hash' end
  end
  if pending and not corrupt then
    -- The job's first write is its journal entry, and it checks the journal:
    -- NOMKSTREAM appends to a stream only (an error for a key of another
    -- type: refused, nothing written; nil for none: its `enqueued` entry,
    -- which the hash still says, goes first, then this one). A dead job's
    -- journal holds its death, so this is one command where it exists.
    XADD[2], XADD[XADD_RUN], XADD[#XADD] = journal_key, f[3] or '0', f[4] or '0'
    local entry = redis.pcall(unpack(XADD))
    if type(entry) == 'table' then
      corrupt = 'journal key is not a stream'
    elseif not entry then
      -- A created_at no stream id can take (a corrupt hash) fails the
      -- `enqueued` entry's XADD, nothing written: refused (Lua's pcall, for
      -- the same reason as the dedup index above).
      if pcall(materialize, job_key, journal_key) then
        redis.call('XADD', journal_key, unpack(XADD, 4)) -- the same, without NOMKSTREAM
      else
        corrupt = 'created_at field is not a time'
      end
    end
  end
  if corrupt then
    refused[#refused + 1] = id
    refused[#refused + 1] = corrupt
  elseif pending then
    redis.call('HSET', job_key, 'state', 'pending', 'failures', '0', 'eligible_at', now_s,
      'updated_at', now_s, 'note', note)
    redis.call('HDEL', job_key, 'finished_at', 'cancel_requested', 'dead_reason', 'expires_at')
    local member = ok and order_lib(feature_keys, graph_queue_keys, job_keys).arrive(ok, f[8], id) or ''
    if member == '' then
      -- back_to_pending (dedup.lua), its ZADD with the batch's others below.
      local z = pending_of[pending]
      if not z then
        z = {}
        pending_of[pending] = z
      end
      z[#z + 1] = now_s
      z[#z + 1] = id
      reindex(KEYS[2], job_key, id, f[5] or false)
    else
      redis.call('HSET', job_key, 'ordered', member) -- behind its key's other jobs
    end
    if f[6] and f[6] ~= '' then offload_repend(prefix, job_key, id) end
    moved[#moved + 1] = id
    kinds[#kinds + 1] = f[7] or ''
    runs[#runs + 1] = f[3] or '0'
  end
end
local n = #moved
if n > 0 then
  each_chunk('ZREM', KEYS[1], moved)
  for k = 4, 7 do
    if pending_of[KEYS[k]] then each_chunk('ZADD', KEYS[k], pending_of[KEYS[k]]) end
  end
  -- A fresh start, not a retry after a failure: out of the `retrying`
  -- index, where a job the claim quarantined may have been left (keys.lua).
  each_chunk('ZREM', retrying_key(prefix), moved)
end
wake_workers(KEYS[3], n)
if events_stream then emit_many('retried', now_s, moved, kinds, runs, nil, note) end
local out = {n}
for _, v in ipairs(moved) do out[#out + 1] = v end
for _, v in ipairs(refused) do out[#out + 1] = v end
return out
