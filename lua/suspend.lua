-- suspend: RUNNING -> SUSPENDED. The job waits, in no eligibility set and
-- holding no worker slot, until `resume` gives it an input.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] running zset
-- KEYS[4] suspended zset
-- KEYS[5] queue meta hash   KEYS[6] event stream (include events.lua)
-- KEYS[7] limits:state hash   KEYS[8] limits:ready zset   KEYS[9] wake list:
--         a run holding a concurrency slot gives it back (include limits.lua)
-- A throttled job (its `dedup_window`) frees its dedup key at once, the
-- index entry and its `dedup:held` field (names derived from the prefix,
-- keys.lua; dedup.lua unhold): a suspended job is not pending, and only a
-- completion opens a window. resume.lua takes the key back if still free.
-- KEYS[10] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''   ARGV[2] key prefix of the queue
-- ARGV[3] job id   ARGV[4] lease token   ARGV[5] note
-- ARGV[6] attachment (msgpack or '')   ARGV[7] carry (msgpack or '')
-- ARGV[8] output (msgpack or '')
--
-- Returns {1} on success, {0, reason} when refused.

-- @include clock.lua
-- @include keys.lua
-- @include lease.lua
-- @include dedup.lua
-- @include limits.lua
-- @include wake.lua

-- What only some suspends need: a refusal's journal entry (lease.lua refuse,
-- through check_owner), a run's concurrency slot to give back (and a worker
-- to wake), a throttled job's dedup key to free. Made by lib() on those
-- paths only (L): each function a script defines at its top is a closure
-- made on every call (benchmarks/README.md, "Session 24").
local L = nil
local function lib()
  -- @lib (scripts.py prune: the helpers only this needs are made here)
  return {refuse = refuse, limits_lib = limits_lib, wake_workers = wake_workers, unhold = unhold,
    dedup_index_key = dedup_index_key, dedup_held_key = dedup_held_key}
end

local now = now_ms(ARGV[1])
local now_s = str(now) -- the writes' string, made once (clock.lua str)
events_open(KEYS[5], KEYS[6], ARGV[2])
local id = ARGV[3]
local refused, run, o = check_owner(KEYS[1], KEYS[2], ARGV[4], 'suspend', now,
  {'dedup_window', 'dedup'}, nil, lib)
if refused then
  return {0, refused}
end
if o[4] then
  L = L or lib()
  if L.limits_lib().release(KEYS[7], KEYS[8], KEYS[1], o[4], now_s) then L.wake_workers(KEYS[9], 1) end
end
leave_running(KEYS[3], KEYS[1], id, ARGV[6], ARGV[7])
redis.call('HSET', KEYS[1], 'state', 'suspended', 'note', ARGV[5], 'updated_at', now_s)
redis.call('HDEL', KEYS[1], 'resume_input', 'eligible_at')
-- lease.lua set_blob, inline: the output, or none.
if ARGV[8] == '' then
  redis.call('HDEL', KEYS[1], 'output')
else
  redis.call('HSET', KEYS[1], 'output', ARGV[8])
end
redis.call('ZADD', KEYS[4], now_s, id)
if o[7] then
  L = L or lib()
  L.unhold(L.dedup_index_key(ARGV[2]), L.dedup_held_key(ARGV[2]), o[8], id)
end
journal(KEYS[2], now_s, 'suspended', run, ARGV[5], ARGV[6], with_claim({}, o[5], o[6]))
compact_journal(KEYS[2])
return {1}
