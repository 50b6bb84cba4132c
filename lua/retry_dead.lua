-- retry_dead: DEAD -> PENDING for an operator (`venturi job retry`,
-- `venturi dead retry`). The failure count restarts at 0, so the retry
-- backstop gives the job its full budget again; the old count is journaled.
--
-- KEYS[1] dead zset   KEYS[2] dedup index hash
-- ARGV[1] key prefix of the queue (job hashes, journals, pending sets and
--         offload snapshots derive from it)
-- ARGV[2] now in ms or ''   ARGV[3] wake list   ARGV[4] note
-- ARGV[5..] job ids
--
-- A retried `@vr.offload` job's snapshot (prefix .. 'offload:' .. token)
-- becomes `pending` again in the same step, without its expiry (include
-- offload.lua), so resolve() and read_result report the rerun, not the old
-- failure.
--
-- Returns {retried, id...}: the ids moved to pending. An id that is not a
-- dead job of this queue (unknown, already retried, purged) is skipped and
-- left untouched.

-- @include common.lua
-- @include offload.lua

local prefix = ARGV[1]
local now = now_ms(ARGV[2])
local out = {0}
for i = 5, #ARGV do
  local id = ARGV[i]
  local job_key = prefix .. 'job:' .. id
  local f = redis.call('HMGET', job_key, 'state', 'priority', 'run_count', 'failures')
  if f[1] == 'dead' then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HSET', job_key, 'state', 'pending', 'failures', 0, 'eligible_at', now,
      'updated_at', now, 'note', ARGV[4])
    redis.call('HDEL', job_key, 'finished_at', 'cancel_requested')
    redis.call('ZADD', prefix .. 'pending:' .. f[2], now, id)
    reindex(KEYS[2], job_key, id)
    offload_repend(prefix, job_key, id)
    journal(prefix .. 'journal:' .. id, now, 'retried', f[3], ARGV[4], nil,
      {'failures_before', f[4] or '0'})
    out[#out + 1] = id
  end
end
out[1] = #out - 1
wake_workers(ARGV[3], out[1])
return out
