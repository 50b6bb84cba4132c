-- reclaim: take back jobs whose lease expired (their worker died, hung or
-- lost its connection). Each reclaim counts as a failed run, so a job that
-- kills its worker every time reaches the retry backstop and goes to dead.
-- The job's lease token is cleared, which fences the old worker out.
--
-- KEYS[1] running zset   KEYS[2] dead zset   KEYS[3] dedup index hash
-- ARGV[1] key prefix of the queue (pending sets, job hashes and journals
--         are derived from it)
-- ARGV[2] now in ms or ''   ARGV[3] at most this many jobs per call
-- ARGV[4] default max_failures ('none' = off)   ARGV[5] wake list
--
-- A job that dies here and is an offload gets its `failed` snapshot and the
-- redacted wake-up (include offload.lua), its error 'lease expired ...'.
--
-- Returns {requeued, dead, id...}.

-- @include common.lua
-- @include offload.lua

local prefix = ARGV[1]
local now = now_ms(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local requeued, died = 0, 0
local out = {0, 0}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local job_key = prefix .. 'job:' .. id
  local journal_key = prefix .. 'journal:' .. id
  local f = redis.call('HMGET', job_key, 'state', 'failures', 'max_failures',
    'priority', 'run_count', 'lease_owner', 'lease_expires')
  if f[1] == 'running' then
    local failures = (tonumber(f[2]) or 0) + 1
    local limit = backstop(f[3], ARGV[4])
    clear_lease(job_key)
    journal(journal_key, now, 'lease_expired', f[5], 'lease expired; worker presumed dead', nil,
      {'worker', f[6] or '', 'lease_expires', f[7] or '', 'failures', failures})
    if limit and failures >= limit then
      redis.call('HSET', job_key, 'state', 'dead', 'failures', failures,
        'note', 'lease expired', 'finished_at', now, 'updated_at', now)
      redis.call('ZADD', KEYS[2], now, id)
      journal(journal_key, now, 'dead', f[5],
        'retry backstop: ' .. failures .. ' failed runs (max_failures=' .. limit .. ')', nil,
        {'reason', 'max_failures'})
      offload_settle(prefix, job_key, id, 'failed', nil,
        'lease expired; retry backstop: ' .. failures .. ' failed runs', now)
      died = died + 1
    else
      redis.call('HSET', job_key, 'state', 'pending', 'failures', failures,
        'note', 'lease expired', 'eligible_at', now, 'updated_at', now)
      redis.call('ZADD', prefix .. 'pending:' .. f[4], now, id)
      reindex(KEYS[3], job_key, id)
      requeued = requeued + 1
    end
    compact_journal(journal_key)
    out[#out + 1] = id
  end
end
out[1] = requeued
out[2] = died
if requeued > 0 then
  wake_workers(ARGV[5], requeued)
end
return out
