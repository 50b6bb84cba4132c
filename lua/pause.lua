-- pause: RUNNING -> PENDING after a cooperative pause (not a failure: the
-- failure count and the retry backstop are untouched).
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] running zset
-- KEYS[4] pending zset of the job's priority   KEYS[5] dedup index hash
-- KEYS[6] wake list
-- KEYS[7] queue meta hash   KEYS[8] event stream (include events.lua)
-- KEYS[9] limits:state hash   KEYS[10] limits:ready zset: a run holding a
--         concurrency slot gives it back (include limits.lua)
-- KEYS[11] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''   ARGV[2] key prefix of the queue
-- ARGV[3] job id   ARGV[4] lease token   ARGV[5] delay in ms (an integer >= 0)
-- ARGV[6] note   ARGV[7] attachment (msgpack or '')   ARGV[8] carry (msgpack or '')
--
-- Returns {1, eligible_at} on success, {0, reason} when refused.
-- Errors: VR_BADARG when the delay is not a whole number of ms (nothing written).

-- @include clock.lua
-- @include lease.lua
-- @include dedup.lua
-- @include wake.lua
-- @include limits.lua

-- What only some pauses need: a refusal's journal entry (lease.lua refuse,
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
local delay = tonumber(ARGV[5])
if not delay or delay ~= delay or delay < 0 or delay ~= math.floor(delay) or delay >= 2^53 then
  return redis.error_reply('VR_BADARG pause delay must be a whole number of ms, got ' .. ARGV[5])
end
local refused, run, o = check_owner(KEYS[1], KEYS[2], ARGV[4], 'pause', now, nil, nil, lib)
if refused then
  return {0, refused}
end
if o[4] then lib().limits_lib().release(KEYS[9], KEYS[10], KEYS[1], o[4], now_s) end
local eligible = str(now + delay)
leave_running(KEYS[3], KEYS[1], id, ARGV[7], ARGV[8])
redis.call('HSET', KEYS[1], 'state', 'pending', 'note', ARGV[6],
  'eligible_at', eligible, 'updated_at', now_s)
-- Back to pending (dedup.lua back_to_pending, inline: its dedup key taken back if free).
redis.call('ZADD', KEYS[4], eligible, id)
reindex(KEYS[5], KEYS[1], id)
journal(KEYS[2], now_s, 'paused', run, ARGV[6], ARGV[7], with_claim({'delay_ms', ARGV[5]}, o[5], o[6]))
compact_journal(KEYS[2])
wake_workers(KEYS[6], 1)
return {1, now + delay}
