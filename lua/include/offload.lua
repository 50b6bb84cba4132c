-- Offload snapshots (venturi_redis/_producer/offload.py). A job enqueued by
-- `@vr.offload` carries two extra fields: `offload`, the random token of the
-- caller's handle, and `offload_ttl`, how long (ms) its settled snapshot is
-- kept. The snapshot hash lives at prefix .. 'offload:' .. token, derived
-- from the queue prefix like every key a script discovers, so it shares the
-- queue's hash tag.
--
-- Snapshot fields (plain text except `value`):
--   status       pending | completed | failed
--   job_id, kind, created_at, finished_at (ms)
--   value        the result, msgpack (completed; absent when it is None)
--   error        the raw error text (failed): authoritative readers only
--
-- The message published on the channel prefix .. 'offload:' .. token .. ':done'
-- is redacted: it says how the job settled, never why it failed.

-- @include keys.lua
-- @include offload_pending.lua

-- Written by retry_dead, atomically with the job's move back to pending: the
-- snapshot of the failed run (or none, if its retention already expired it)
-- becomes pending again, so a reader sees the rerun coming, not the old
-- failure, and resolve() waits for the rerun to settle. No wake-up: a waiter
-- that saw the failure has returned, and one that reads now sees pending.
-- A no-op for jobs that are not offloads.
local function offload_repend(prefix, job_key, id)
  local f = redis.call('HMGET', job_key, 'offload', 'kind', 'created_at')
  if not f[1] or f[1] == '' then
    return
  end
  local key = offload_key(prefix, f[1])
  if key then
    offload_write_pending(key, id, f[2], f[3])
  end
end

-- The job fields offload_settle reads: a caller that reads the job hash
-- anyway (check_owner's `more`) passes them in as `pre`, saving a call.
local OFFLOAD_FIELDS = {'offload', 'offload_ttl'}

-- Write the authoritative snapshot of a job that settled and publish the
-- redacted wake-up. A no-op for jobs that are not offloads, and for callers
-- that pass no prefix. status: 'completed' (with `value`, msgpack or '') or
-- 'failed' (with `err`, the raw error text). `pre` is optional: the
-- OFFLOAD_FIELDS values, in that order, read before this run's writes.
local function offload_settle(prefix, job_key, id, status, value, err, now, pre)
  if prefix == nil or prefix == '' then
    return
  end
  local f = pre or redis.call('HMGET', job_key, unpack(OFFLOAD_FIELDS))
  local key = offload_key(prefix, f[1])
  if not key then
    return
  end
  -- A snapshot key overwritten by hand (not a hash) is replaced by the
  -- settled snapshot: the caller's transition is written by now, and a
  -- failing HDEL would leave it half done (issue 26). One pcall, no extra
  -- command on the usual path.
  local cleared = redis.pcall('HDEL', key, 'value', 'error')
  if type(cleared) == 'table' and cleared.err then
    redis.call('DEL', key)
  end
  redis.call('HSET', key, 'status', status, 'job_id', id, 'finished_at', now)
  local message
  if status == 'completed' then
    if value ~= nil and value ~= '' then
      redis.call('HSET', key, 'value', value)
    end
    message = '{"status":"completed"}'
  else
    redis.call('HSET', key, 'error', err or '')
    message = '{"status":"failed","error":"terminal error"}'
  end
  -- Whole ms only: PEXPIRE refuses '1.5' or 'inf' (an offload_ttl edited by
  -- hand), which would fail the transition after its writes; such a value
  -- keeps the snapshot without expiry rather than lose the outcome.
  local ttl = tonumber(f[2])
  if ttl and ttl >= 1 and ttl < 9007199254740992 then
    redis.call('PEXPIRE', key, string.format('%d', math.floor(ttl)))
  end
  redis.call('PUBLISH', key .. ':done', message)
end
