-- release: RUNNING -> PENDING on graceful shutdown. Not a failure: the
-- failure count is untouched and the carry is saved, so the next run
-- continues where this one stopped.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] running zset
-- KEYS[4] pending zset of the job's priority   KEYS[5] dedup index hash
-- KEYS[6] wake list
-- KEYS[7] queue meta hash   KEYS[8] event stream (include events.lua)
-- KEYS[9] limits:state hash   KEYS[10] limits:ready zset: a run holding a
--         concurrency slot gives it back (include limits.lua)
-- KEYS[11] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''   ARGV[2] key prefix of the queue
-- ARGV[3] job id   ARGV[4] lease token   ARGV[5] carry (msgpack or '')
-- ARGV[6] note
--
-- Returns {1} on success, {0, reason} when refused.

-- @include clock.lua
-- @include lease.lua
-- @include dedup.lua
-- @include wake.lua
-- @include limits.lua

-- What only some releases need: a refusal's journal entry (lease.lua refuse,
-- through check_owner) and a run's concurrency slot to give back. Made by
-- lib() on those paths only: each function a script defines at its top is
-- a closure made on every call (benchmarks/README.md, "Session 24").
local function lib()
  -- @lib (scripts.py prune: the helpers only this needs are made here)
  return {refuse = refuse, limits_lib = limits_lib}
end

local now = now_ms(ARGV[1])
local now_s = str(now) -- the writes' string, made once (clock.lua str)
events_open(KEYS[7], KEYS[8], ARGV[2])
local id = ARGV[3]
local refused, run, o = check_owner(KEYS[1], KEYS[2], ARGV[4], 'release', now, nil, nil, lib)
if refused then
  return {0, refused}
end
if o[4] then lib().limits_lib().release(KEYS[9], KEYS[10], KEYS[1], o[4], now_s) end
redis.call('ZREM', KEYS[3], id)
redis.call('HDEL', KEYS[1], 'lease_token', 'lease_expires', 'claimed_at') -- lease.lua clear_lease
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'carry', ARGV[5]) end
redis.call('HSET', KEYS[1], 'state', 'pending', 'eligible_at', now_s, 'updated_at', now_s)
-- Back to pending (dedup.lua back_to_pending, inline: its dedup key taken back if free).
redis.call('ZADD', KEYS[4], now_s, id)
reindex(KEYS[5], KEYS[1], id)
journal(KEYS[2], now_s, 'released', run, ARGV[6], nil, with_claim({}, o[5], o[6]))
compact_journal(KEYS[2])
wake_workers(KEYS[6], 1)
return {1}
