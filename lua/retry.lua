-- retry: RUNNING -> PENDING (after a backoff delay computed here, jitter
-- included) or -> DEAD when the failure count reaches the retry backstop.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] running zset
-- KEYS[4] pending zset of the job's priority   KEYS[5] dead zset
-- KEYS[6] dedup index hash   KEYS[7] wake list
-- KEYS[8] queue meta hash (its `history` field: include history.lua, the
--         failed run, and a death, counted by kind)
-- KEYS[9] event stream (include events.lua)
-- KEYS[10] limits:state hash   KEYS[11] limits:ready zset: a run holding a
--         concurrency slot gives it back (include limits.lua)
-- When the backstop kills a job others wait on, they apply their policy
-- (graph.lua; its queue-wide keys derive from the prefix, keys.lua).
-- A throttled job the backstop kills frees its dedup key at once (dedup.lua
-- unhold; the `dedup:held` set's name derives from the prefix, keys.lua);
-- one back to pending keeps it.
-- A job with an order key keeps it while it waits for its retry; killed by
-- the backstop, it releases it to the key's next job (order.lua).
-- A job back to pending joins the `retrying` index (keys.lua retrying_key),
-- scored by when it is due, unless its cancel was requested (the claim
-- that reaches it cancels it instead of running it).
-- KEYS[12] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''
-- ARGV[2] key prefix of the queue: when the backstop kills an offload job,
--         its snapshot becomes `failed` with the error and the redacted
--         wake-up is published (include offload.lua)
-- ARGV[3] job id   ARGV[4] lease token   ARGV[5] note (the error message)
-- ARGV[6] attachment (msgpack or '')   ARGV[7] carry (msgpack or '')
-- ARGV[8] backoff base ms   ARGV[9] cap ms   ARGV[10] jitter fraction
-- ARGV[11] default max_failures ('none' = off)
-- ARGV[12] exception type of the failure ('' = none)
-- ARGV[13] tail of its traceback ('' = none), kept in the `failed` entry
--
-- Returns {1, 'pending', delay_ms, failures} or {1, 'dead', 0, failures},
-- or {0, reason} when refused.

-- @include clock.lua
-- @include keys.lua
-- @include lease.lua
-- @include dedup.lua
-- @include wake.lua
-- @include backoff.lua
-- @include offload.lua
-- @include graph.lua
-- @include limits.lua
-- @include history.lua
-- @include order.lua

-- What only some retries need: a refusal's journal entry (lease.lua refuse,
-- through check_owner), a run's concurrency slot to give back, the
-- metrics history, and the backstop's death (the job's dedup key, offload
-- snapshot, dependents and order key). Made by lib() at the first use in a
-- call (L): each function a script defines at its top is a closure made on
-- every call, and the usual retry, back to pending, needs none of these
-- (benchmarks/README.md, "Session 24").
local L = nil
local function lib()
  -- @lib (scripts.py prune: the helpers only this needs are made here)
  return {refuse = refuse, limits_lib = limits_lib, history_count = history_count,
    history_flush = history_flush, unhold = unhold, dedup_held_key = dedup_held_key, offload_settle = offload_settle,
    graph_finished = graph_finished, order_lib = order_lib, feature_keys = feature_keys,
    graph_queue_keys = graph_queue_keys}
end

local now = now_ms(ARGV[1])
-- The numbers this writes, as strings made once (clock.lua str: Redis's Lua
-- would format each with "%.17g" at every use, ~2,900 instructions each).
local now_s = str(now)
-- The meta hash's two switches in one read, the job's fields with its lease check's.
local meta = redis.call('HMGET', KEYS[8], 'events', 'history')
events_open(KEYS[8], KEYS[9], ARGV[2], meta[1])
history_counts = meta[2] == '1' and {} or nil
local id = ARGV[3]
local refused, run, o, entries = check_owner(KEYS[1], KEYS[2], ARGV[4], 'retry', now,
  {'failures', 'max_failures', 'dependents', 'cancel_requested', 'dedup_window', 'dedup', 'kind', 'order_key',
    'created_at', 'priority', 'eligible_at'}, 15, lib)
if refused then
  return {0, refused}
end
if o[4] then
  L = L or lib()
  if L.limits_lib().release(KEYS[10], KEYS[11], KEYS[1], o[4], now_s) then
    wake_workers(KEYS[7], 1)
  end
end
local f = {unpack(o, 7, 14)} -- failures, max_failures, ..., order_key
local failures = (tonumber(f[1]) or 0) + 1
local failures_s = str(failures)
local limit = backstop(f[2], ARGV[11])
leave_running(KEYS[3], KEYS[1], id, ARGV[6], ARGV[7])

if limit and failures >= limit then
  -- Killed by the backstop: dead, its key, offload, dependents and order key
  -- seen to (the lib's helpers).
  L = L or lib()
  redis.call('HSET', KEYS[1], 'state', 'dead', 'failures', failures_s,
    'note', ARGV[5], 'dead_reason', 'max_failures', 'finished_at', now_s, 'updated_at', now_s)
  redis.call('ZADD', KEYS[5], now_s, id)
  if f[5] then L.unhold(KEYS[6], L.dedup_held_key(ARGV[2]), f[6], id) end -- throttled: no window
  journal(KEYS[2], now_s, 'failed', run, ARGV[5], ARGV[6],
    with_error(with_claim({'failures', failures_s}, o[5], o[6]), ARGV[12], ARGV[13]), f[7] or '')
  journal(KEYS[2], now_s, 'dead', run,
    'retry backstop: ' .. failures .. (failures == 1 and ' failed run' or ' failed runs') ..
    ' (max_failures=' .. limit .. ')', nil,
    {'reason', 'max_failures'}, f[7] or '')
  compact_journal(KEYS[2], entries + 2) -- with `failed` and `dead`
  L.offload_settle(ARGV[2], KEYS[1], id, 'failed', nil, ARGV[5], now)
  if f[3] then
    L.graph_finished(ARGV[2], f[3], KEYS[1], id, now, false, nil, ARGV[5])
  end
  if history_counts then
    L.history_count(f[7] or '', 'failed', 1)
    L.history_count(f[7] or '', 'dead', 1)
    L.history_flush(ARGV[2], now)
  end
  if f[8] then
    L.order_lib(L.feature_keys, L.graph_queue_keys, job_keys).release(ARGV[2], KEYS[1], f[8], id, nil)
  end
  return {1, 'dead', 0, failures}
end

local delay = backoff_delay_ms(id, failures, tonumber(ARGV[8]), tonumber(ARGV[9]),
  tonumber(ARGV[10]))
local eligible = str(now + delay)
redis.call('HSET', KEYS[1], 'state', 'pending', 'failures', failures_s,
  'note', ARGV[5], 'eligible_at', eligible, 'updated_at', now_s)
-- Back to pending (dedup.lua back_to_pending, inline: its dedup key taken back if free).
redis.call('ZADD', KEYS[4], eligible, id)
reindex(KEYS[6], KEYS[1], id, f[6])
if not f[4] then redis.call('ZADD', retrying_key(ARGV[2]), eligible, id) end
journal(KEYS[2], now_s, 'failed', run, ARGV[5], ARGV[6],
  with_error(with_claim({'failures', failures_s, 'delay_ms', str(delay)}, o[5], o[6]), ARGV[12], ARGV[13]), f[7] or '')
compact_journal(KEYS[2], entries + 1) -- with `failed`
wake_workers(KEYS[7], 1)
if history_counts then
  L = L or lib()
  L.history_count(f[7] or '', 'failed', 1)
  L.history_flush(ARGV[2], now)
end
return {1, 'pending', delay, failures}
