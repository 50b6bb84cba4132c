-- purge: remove finished jobs (completed, dead or cancelled) together with
-- their journals and any index entry, oldest first, at most `limit` per call
-- so no call runs long. Used by retention trimming (a cutoff in the past)
-- and by `venturi purge` (everything finished up to now).
--
-- KEYS[1] the finished zset (completed | dead | cancelled), scored by finish time
-- KEYS[2] dedup index hash
-- KEYS[3] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
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
-- A removed job leaves the `retrying` index too (keys.lua retrying_key), and
-- the `expiring` index (expiring_key).
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
--
-- The jobs are read first, then written, what the batch shares once per
-- call (each command a script calls costs Redis more than its own work):
-- one ZREM from the zset, one from `retrying`, one DEL of every key that
-- goes, one HMGET and one HDEL of the dedup index for the jobs that own
-- their key there.
-- Errors: VR_WRONGTYPE when the zset or the `retrying` index is not a sorted
-- set, or, for a job whose dedup key is to be freed, the dedup index is not
-- a hash (read before the first write: nothing written).

-- @include clock.lua
-- @include keys.lua
-- @include states.lua
-- @include operator.lua

local prefix = ARGV[2]
local now = now_ms(ARGV[1])
local retrying = retrying_key(prefix)
for _, key in ipairs({KEYS[1], retrying}) do
  if type(redis.pcall('ZCARD', key)) == 'table' then
    return redis.error_reply('VR_WRONGTYPE ' .. key .. ' is not a sorted set')
  end
end
local ids = {}
local more = 0
if #ARGV > 6 then
  -- A list of ids: those the zset still holds (the others were retried or
  -- removed since the caller read them), each once.
  local seen = {}
  for j = 7, #ARGV, 1000 do
    local last = math.min(j + 999, #ARGV)
    local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, j, last))
    for k = j, last do
      local id = ARGV[k]
      if scores[k - j + 1] and not seen[id] then
        seen[id] = true
        ids[#ids + 1] = id
      end
    end
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
local gone = {} -- the removed jobs' ids
local keys = {} -- their keys: hash, journal, workflow keys
local fields, owners = {}, {} -- dedup index fields to free, and the id each must still point at
for _, id in ipairs(ids) do
  local job_key, journal_key = job_keys(prefix, id)
  local f = redis.pcall('HMGET', job_key, 'state', 'dedup', 'dedup_until')
  local removed = false
  if f.err then
    removed = true
  elseif f[1] == ARGV[4] or not f[1] or not JOB_STATES[f[1]] then
    removed = true
    -- A throttled job inside its window keeps its key held (docs/dedup.md):
    -- the `dedup:held` set says until when, and the reclaim's sweep frees it.
    if f[2] and f[2] ~= '' and not (f[3] and (tonumber(f[3]) or 0) > now) then
      fields[#fields + 1] = f[2]
      owners[#owners + 1] = id
    end
  end
  if removed then
    gone[#gone + 1] = id
    local deps_key, dependents_key, results_key = graph_keys(prefix, id)
    local n = #keys
    keys[n + 1], keys[n + 2], keys[n + 3], keys[n + 4], keys[n + 5] =
      job_key, journal_key, deps_key, dependents_key, results_key
  end
end
-- dedup.lua's unindex, for the batch: a field goes while it still names its job.
local holders = nil
if #fields > 0 then
  holders = redis.pcall('HMGET', KEYS[2], unpack(fields))
  if holders.err then
    return redis.error_reply('VR_WRONGTYPE ' .. KEYS[2] .. ' is not a hash')
  end
end
-- The writes: nothing above wrote.
if holders then
  local freed = {}
  for k = 1, #fields do
    if holders[k] == owners[k] then freed[#freed + 1] = fields[k] end
  end
  if #freed > 0 then each_chunk('HDEL', KEYS[2], freed) end
end
if #ids > 0 then each_chunk('ZREM', KEYS[1], ids) end
if #gone > 0 then
  each_chunk('DEL', nil, keys)
  -- A job the claim cancelled or quarantined while it waited for a retry
  -- left no other trace in the `retrying` index (keys.lua): it goes here.
  each_chunk('ZREM', retrying, gone)
  -- And a job with a start deadline its `expiring` entry (keys.lua expiring_key).
  local exp_key = expiring_key(prefix)
  if redis.call('EXISTS', exp_key) == 1 then each_chunk('ZREM', exp_key, gone) end
end
return {#gone, more}
