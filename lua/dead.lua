-- dead: RUNNING -> DEAD at once: a permanent error, an unknown kind, or a
-- payload that does not decode. Counts as a failed run.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] running zset
-- KEYS[4] dead zset
-- KEYS[5] queue meta hash (its `history` field: include history.lua, the
--         failed run and the death, counted by kind)
-- KEYS[6] event stream (include events.lua)
-- KEYS[7] limits:state hash   KEYS[8] limits:ready zset   KEYS[9] wake list:
--         a run holding a concurrency slot gives it back (include limits.lua)
-- The jobs waiting on this one apply their on_dependency_failure policy
-- (graph.lua; its queue-wide keys derive from the prefix, keys.lua).
-- A throttled job (its `dedup_window`) frees its dedup key at once, the
-- index entry and its `dedup:held` field (names derived from the prefix,
-- keys.lua; dedup.lua unhold): only a completion opens a window.
-- A job with an order key releases it to the key's next job (order.lua).
-- KEYS[10] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''
-- ARGV[2] key prefix of the queue: when the job is an offload, its snapshot
--         becomes `failed` with the note as its error and the redacted
--         wake-up is published (include offload.lua)
-- ARGV[3] job id   ARGV[4] lease token   ARGV[5] note
-- ARGV[6] attachment (msgpack or '')   ARGV[7] carry (msgpack or '')
-- ARGV[8] reason: permanent | unknown_kind | bad_payload
-- ARGV[9] exception type of the failure ('' = none)
-- ARGV[10] tail of its traceback ('' = none), kept in the journal entry
--
-- Returns {1} on success, {0, reason} when refused.

-- @include clock.lua
-- @include keys.lua
-- @include lease.lua
-- @include dedup.lua
-- @include offload.lua
-- @include graph.lua
-- @include limits.lua
-- @include wake.lua
-- @include history.lua
-- @include order.lua

-- What only some deaths need: a refusal's journal entry (lease.lua refuse,
-- through check_owner), a throttled job's dedup key to free, an offload's
-- snapshot to settle, dependents to tell, an order key to pass on, a run's
-- concurrency slot to give back, the metrics history. Made by lib() at the
-- first use in a call (L): each function a script defines at its top is a
-- closure made on every call, and the usual death needs none of these
-- (benchmarks/README.md, "Session 24").
local L = nil
local function lib()
  -- @lib (scripts.py prune: the helpers only this needs are made here)
  return {refuse = refuse, unhold = unhold, dedup_index_key = dedup_index_key,
    dedup_held_key = dedup_held_key, offload_settle = offload_settle, graph_finished = graph_finished,
    order_lib = order_lib, feature_keys = feature_keys, graph_queue_keys = graph_queue_keys,
    limits_lib = limits_lib, wake_workers = wake_workers, history_count = history_count,
    history_flush = history_flush}
end

local now = now_ms(ARGV[1])
local now_s = str(now) -- the writes' string, made once (clock.lua str)
events_open(KEYS[5], KEYS[6], ARGV[2])
history_counts = redis.call('HGET', KEYS[5], 'history') == '1' and {} or nil
local id = ARGV[3]
local refused, run, f = check_owner(KEYS[1], KEYS[2], ARGV[4], 'dead', now,
  {OFFLOAD_FIELDS[1], OFFLOAD_FIELDS[2], 'dependents', 'dedup_window', 'dedup', 'kind', 'order_key'}, nil,
  lib)
if refused then
  return {0, refused}
end
leave_running(KEYS[3], KEYS[1], id, ARGV[6], ARGV[7])
redis.call('HINCRBY', KEYS[1], 'failures', 1)
redis.call('HSET', KEYS[1], 'state', 'dead', 'note', ARGV[5], 'dead_reason', ARGV[8],
  'finished_at', now_s, 'updated_at', now_s)
redis.call('ZADD', KEYS[4], now_s, id)
if f[10] then
  L = L or lib()
  L.unhold(L.dedup_index_key(ARGV[2]), L.dedup_held_key(ARGV[2]), f[11], id)
end
journal(KEYS[2], now_s, 'dead', run, ARGV[5], ARGV[6],
  with_error(with_claim({'reason', ARGV[8]}, f[5], f[6]), ARGV[9], ARGV[10]))
compact_journal(KEYS[2])
if f[7] then -- an offload (offload_settle does nothing for a job with no token)
  L = L or lib()
  L.offload_settle(ARGV[2], KEYS[1], id, 'failed', nil, ARGV[5], now, {f[7], f[8]})
end
if f[9] then
  L = L or lib()
  L.graph_finished(ARGV[2], f[9], KEYS[1], id, now, false, nil, ARGV[5])
end
if f[13] then
  L = L or lib()
  L.order_lib(L.feature_keys, L.graph_queue_keys, job_keys).release(ARGV[2], KEYS[1], f[13], id, nil)
end
if f[4] then
  L = L or lib()
  if L.limits_lib().release(KEYS[7], KEYS[8], KEYS[1], f[4], now_s) then L.wake_workers(KEYS[9], 1) end
end
if history_counts then
  L = L or lib()
  L.history_count(f[12] or '', 'failed', 1)
  L.history_count(f[12] or '', 'dead', 1)
  L.history_flush(ARGV[2], now)
end
return {1}
