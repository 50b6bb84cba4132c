-- purge: remove finished jobs (completed, dead or cancelled) together with
-- their journals and any index entry, oldest first, at most `limit` per call
-- so no call runs long. Used by retention trimming (a cutoff in the past)
-- and by `venturi purge` (everything finished up to now).
--
-- KEYS[1] the finished zset (completed | dead | cancelled), scored by finish time
-- KEYS[2] dedup index hash
-- ARGV[1] now in ms or ''
-- ARGV[2] key prefix of the queue (job hashes and journals derive from it)
-- ARGV[3] keep jobs that finished less than this many ms before now (0 = none
--         kept; '' = no age bound)
-- ARGV[4] the state the zset holds ('completed', 'dead' or 'cancelled')
-- ARGV[5] at most this many jobs per call
-- ARGV[6] keep at most this many, the newest ('' = no count bound): the
--         oldest beyond them go too (retention's count bound, issue 47)
-- ARGV[7..] job ids (optional): remove exactly these instead (a purge by
--         filter, _producer/bulk.py), each only while the zset still holds
--         it (so a job retried since, or purged already, is skipped: safe to
--         run twice); ARGV[3], ARGV[5] and ARGV[6] are then unused
--
-- A completed throttled job inside its window (`dedup_until`) keeps its
-- dedup index entry: the window outlives the job (docs/dedup.md).
-- A removed job leaves the `retrying` index too (keys.lua retrying_key).
-- A removed job's workflow keys go with it (keys.lua graph_keys): its
-- dependents set and the results copied to it (its deps set is gone by the
-- time it finished).
--
-- Returns {removed, more}: more = 1 when older jobs remain past this batch
-- (always 0 for a list of ids).
-- An id whose hash is in another state (retried since) is only dropped from
-- the zset; its hash and journal are left alone. A job key of the wrong type
-- (a quarantined job's) is removed with its journal, and so is a job whose
-- state is none a job can be in (written by hand): left, it would be in no index.

-- @include clock.lua
-- @include keys.lua
-- @include dedup.lua
-- @include states.lua

local prefix = ARGV[2]
local now = now_ms(ARGV[1])
local ids = {}
local more = 0
if #ARGV > 6 then
  -- A list of ids: those the zset still holds (the others were retried or
  -- removed since the caller read them).
  for i = 7, #ARGV do
    if redis.call('ZSCORE', KEYS[1], ARGV[i]) then ids[#ids + 1] = ARGV[i] end
  end
else
  local limit = tonumber(ARGV[5])
  -- How many of the oldest go: those past the age, or beyond the count, whichever is more.
  local doomed = 0
  if ARGV[3] ~= '' then
    doomed = redis.call('ZCOUNT', KEYS[1], '-inf', now - tonumber(ARGV[3]))
  end
  if ARGV[6] ~= '' then
    local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[6])
    if over > doomed then doomed = over end
  end
  if doomed > limit then
    more = 1
    doomed = limit
  end
  if doomed > 0 then
    ids = redis.call('ZRANGE', KEYS[1], 0, doomed - 1)
  end
end
local removed = 0
local retrying = retrying_key(prefix)
for _, id in ipairs(ids) do
  local before = removed
  redis.call('ZREM', KEYS[1], id)
  local job_key, journal_key = job_keys(prefix, id)
  local deps_key, dependents_key, results_key = graph_keys(prefix, id)
  local f = redis.pcall('HMGET', job_key, 'state', 'dedup', 'dedup_until')
  if f.err then
    redis.call('DEL', job_key, journal_key, deps_key, dependents_key, results_key)
    removed = removed + 1
  elseif f[1] == ARGV[4] or not f[1] or not JOB_STATES[f[1]] then
    -- A throttled job inside its window keeps its key held (docs/dedup.md):
    -- the `dedup:held` set says until when, and the reclaim's sweep frees it.
    if not (f[3] and (tonumber(f[3]) or 0) > now) then
      unindex(KEYS[2], f[2], id)
    end
    redis.call('DEL', job_key, journal_key, deps_key, dependents_key, results_key)
    removed = removed + 1
  end
  -- A job the claim cancelled or quarantined while it waited for a retry
  -- left no other trace in the `retrying` index (keys.lua): it goes here.
  if removed > before then redis.call('ZREM', retrying, id) end
end
return {removed, more}
