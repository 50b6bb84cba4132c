-- A job coming back to pending, or leaving it: its dedup index entry.

-- Dedup policy when a job comes back to pending (pause, retry, release,
-- reclaim, resume, retry_dead): it takes its key back if no other pending
-- job holds it; otherwise the index keeps pointing at the holder and this job
-- runs as its own row, no longer a merge candidate. `field`: the job's
-- `dedup` field when the caller read it anyway (nil: read here; false: none).
local function reindex(dedup_key, job_key, id, field)
  if field == nil then field = redis.call('HGET', job_key, 'dedup') end
  if field and field ~= '' then
    redis.call('HSETNX', dedup_key, field, id)
  end
end

-- Drop the index entry of a job leaving pending, if the entry is its own.
local function unindex(dedup_key, field, id)
  if field and field ~= '' and redis.call('HGET', dedup_key, field) == id then
    redis.call('HDEL', dedup_key, field)
  end
end

-- Back to pending: into its pending set at `eligible`, its dedup key taken
-- back if free. The caller has written the hash (state, eligible_at) and
-- wakes the workers (once per call: wake_workers). `field`: as reindex's.
local function back_to_pending(pending, dedup_key, job_key, id, eligible, field)
  redis.call('ZADD', pending, eligible, id)
  reindex(dedup_key, job_key, id, field)
end

-- A throttled job (a dedup window, docs/dedup.md) ending other than
-- completed: dead, cancelled, suspended or quarantined, from its run or
-- from pending. Only a completion opens a window, so the key is free at
-- once: its index entry, if still its own, and its look in `dedup:held`
-- (keys.lua dedup_held_key) with it, so the sweep has nothing of it to keep.
-- In pcalls: an index or held set of the wrong type leaves the key to the
-- sweep (or the next enqueue's check), it does not stop the ending half
-- written.
local function unhold(dedup_key, held_key, field, id)
  if field and field ~= '' and redis.pcall('HGET', dedup_key, field) == id then
    redis.call('HDEL', dedup_key, field)
    redis.pcall('ZREM', held_key, field)
  end
end
