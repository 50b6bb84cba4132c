-- cancel: PENDING, SUSPENDED or WAITING -> CANCELLED at once (an operator's
-- cancel; a waiting job leaves the workflow graph: graph.lua graph_detach);
-- RUNNING -> cancel requested (the worker is told through `extend` and asks
-- the handler to stop through its context); RUNNING -> CANCELLED for the
-- worker that holds the lease, once its handler has stopped.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] suspended zset
-- KEYS[4] running zset   KEYS[5] cancelled zset   KEYS[6] dedup index hash
-- KEYS[7..10] pending zsets, CRITICAL first (a pending job leaves them all:
--         its priority field is not trusted to name its set)
-- KEYS[11] queue meta hash   KEYS[12] event stream (include events.lua)
-- KEYS[13] limits:state hash   KEYS[14] limits:ready zset   KEYS[15] wake list
-- KEYS[16] limits:parked zset: a run holding a concurrency slot gives it back,
--         a pending job parked on a limit leaves the parked set (limits.lua)
-- A pending job leaves the `retrying` index (keys.lua retrying_key).
-- A throttled job (a `dedup_window`) leaves its key free at once, and its
-- field the `dedup:held` set (keys.lua dedup_held_key; dedup.lua unhold):
-- only a completion opens a window (docs/dedup.md).
-- A job with an order key leaves its key's queue, or, holding the key, lets the
-- key's next job go (order.lua).
-- A WAITING job leaves the graph; the jobs waiting on a cancelled job apply
-- their on_dependency_failure policy (graph.lua; its queue-wide keys derive
-- from the prefix, keys.lua graph_queue_keys).
-- KEYS[17] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''
-- ARGV[2] key prefix of the queue (a cancelled offload job settles its
--         snapshot as failed, offload.lua)
-- ARGV[3] job id   ARGV[4] note (who cancelled, why)
-- ARGV[5] lease token: '' for an operator; the worker's token when the worker
--         ends its own run cancelled (then ARGV[6] attachment, ARGV[7] carry)
--
-- Returns {1, 'cancelled'} (the job is now cancelled), {1, 'requested'} (it
-- is running; its worker will stop it), or {0, reason} when nothing was done
-- (unknown job, already finished, or a stale lease token).
-- Errors: VR_CORRUPTJOB for an operator's cancel of a job whose own data is
-- corrupt (its job key not a hash, its journal not a stream, no state field:
-- operator.lua); nothing written.

-- @include clock.lua
-- @include lease.lua
-- @include dedup.lua
-- @include finish.lua
-- @include graph.lua
-- @include limits.lua
-- @include wake.lua
-- @include operator.lua
-- @include order.lua

-- A refusal's journal entry (lease.lua refuse, through check_owner), made
-- on that path only (benchmarks/README.md, "Session 24").
local function lib()
  -- @lib (scripts.py prune: the helpers only this needs are made here)
  return {refuse = refuse}
end

local now = now_ms(ARGV[1])
local now_s = str(now) -- the writes' string, made once (clock.lua str)
events_open(KEYS[11], KEYS[12], ARGV[2])
local id = ARGV[3]
local token = ARGV[5]
local fields = {'state', 'run_count', 'dedup', 'cancel_requested', 'dependents', 'parked', 'dedup_window',
  'order_key', 'ordered'}
local f
if token == '' then
  -- An operator's cancel: a job whose own data is corrupt is refused before
  -- any write (operator.lua), not cancelled half way (the journal's XADD,
  -- last, used to fail after the job had left its set).
  local corrupt
  f, corrupt = read_job(KEYS[1], KEYS[2], fields)
  if corrupt then
    return corrupt_job(id, corrupt)
  end
else
  -- The worker's own run: check_owner below refuses a corrupt journal.
  f = redis.pcall('HMGET', KEYS[1], unpack(fields))
  if f.err then
    return {0, 'job key is not a hash'}
  end
end
if not f[1] then
  return {0, 'job does not exist'}
end
local state = f[1]
-- A pending job never journaled gets its `enqueued` entry before any write
-- (the pending branch drops eligible_at).
materialize(KEYS[1], KEYS[2])

if state == 'running' and token == '' then
  -- Not ours to stop: flag it. The holder's next lease renewal sees the flag;
  -- a run that ends before noticing lands in pending and is cancelled by the
  -- claim that would have picked it up.
  if not f[4] then
    redis.call('HSET', KEYS[1], 'cancel_requested', now_s, 'updated_at', now_s)
    journal(KEYS[2], now_s, 'cancel_requested', f[2], ARGV[4], nil)
  end
  return {1, 'requested'}
end

local owner, claimed = nil, nil -- the claim of the run a worker ends cancelled
if token ~= '' then
  local refused, _, o = check_owner(KEYS[1], KEYS[2], token, 'cancel', now, nil, nil, lib)
  if refused then
    return {0, refused}
  end
  if o[4] and limits_lib().release(KEYS[13], KEYS[14], KEYS[1], o[4], now_s) then
    wake_workers(KEYS[15], 1)
  end
  leave_running(KEYS[4], KEYS[1], id, ARGV[6], ARGV[7])
  owner, claimed = o[5], o[6]
  -- Throttled: the run kept its key (claim.lua); a cancel opens no window.
  if f[7] then unhold(KEYS[6], dedup_held_key(ARGV[2]), f[3], id) end
elseif state == 'pending' then
  redis.call('ZREM', KEYS[7], id)
  redis.call('ZREM', KEYS[8], id)
  redis.call('ZREM', KEYS[9], id)
  redis.call('ZREM', KEYS[10], id)
  if f[6] then
    limits_lib().unpark(KEYS[16], f[6])
    redis.call('HDEL', KEYS[1], 'parked')
  end
  redis.call('ZREM', retrying_key(ARGV[2]), id) -- waiting for a retry, maybe (keys.lua)
  if f[7] then
    unhold(KEYS[6], dedup_held_key(ARGV[2]), f[3], id) -- and a look an earlier run left
  else
    unindex(KEYS[6], f[3], id)
  end
elseif state == 'suspended' then
  redis.call('ZREM', KEYS[3], id)
  -- Its suspend freed the key; one suspended before that did not.
  if f[7] then unhold(KEYS[6], dedup_held_key(ARGV[2]), f[3], id) end
elseif state == 'waiting' then
  redis.call('ZREM', graph_queue_keys(ARGV[2]).waiting, id)
  graph_detach(ARGV[2], id)
else
  return {0, 'job is ' .. state}
end
if f[8] then
  order_lib(feature_keys, graph_queue_keys, job_keys).release(ARGV[2], KEYS[1], f[8], id, f[9] or nil)
end
finish_cancelled(ARGV[2], KEYS[1], KEYS[2], KEYS[5], id, now, f[2], ARGV[4], state, owner, claimed)
if f[5] then
  graph_finished(ARGV[2], f[5], KEYS[1], id, now, false, nil,
    'cancelled: ' .. ARGV[4])
end
return {1, 'cancelled'}
