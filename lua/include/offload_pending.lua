-- An offload job's pending snapshot, written by enqueue with the job (the
-- snapshot's fields: offload.lua).

-- A fresh pending snapshot: no outcome, no expiry (a pending job's snapshot
-- must outlive any wait for it; the retention starts when the job settles).
local function offload_write_pending(snapshot_key, id, kind, created)
  redis.call('DEL', snapshot_key)
  redis.call('HSET', snapshot_key, 'status', 'pending', 'job_id', id, 'kind', kind,
    'created_at', created)
end

-- Written by enqueue, atomically with the job it describes.
local function offload_pending(snapshot_key, job_key, id, kind, token, ttl, now)
  redis.call('HSET', job_key, 'offload', token, 'offload_ttl', ttl)
  offload_write_pending(snapshot_key, id, kind, now)
end
