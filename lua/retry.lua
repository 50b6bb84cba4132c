-- retry: RUNNING -> PENDING (after a backoff delay computed here, jitter
-- included) or -> DEAD when the failure count reaches the retry backstop.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] running zset
-- KEYS[4] pending zset of the job's priority   KEYS[5] dead zset
-- KEYS[6] dedup index hash
-- ARGV[1] job id   ARGV[2] lease token   ARGV[3] now in ms or ''
-- ARGV[4] note (the error message)   ARGV[5] attachment (msgpack or '')
-- ARGV[6] carry (msgpack or '')   ARGV[7] backoff base ms   ARGV[8] cap ms
-- ARGV[9] jitter fraction   ARGV[10] default max_failures ('none' = off)
-- ARGV[11] wake list
-- ARGV[12] key prefix of the queue (optional): when the backstop kills an
--          offload job, its snapshot becomes `failed` with the error and the
--          redacted wake-up is published (include offload.lua)
--
-- Returns {1, 'pending', delay_ms, failures} or {1, 'dead', 0, failures},
-- or {0, reason} when refused.

-- @include common.lua
-- @include backoff.lua
-- @include offload.lua

local id = ARGV[1]
local now = now_ms(ARGV[3])
local refused, run = check_owner(KEYS[1], KEYS[2], ARGV[2], 'retry', now)
if refused then
  return {0, refused}
end
local f = redis.call('HMGET', KEYS[1], 'failures', 'max_failures')
local failures = (tonumber(f[1]) or 0) + 1
local limit = backstop(f[2], ARGV[10])
redis.call('ZREM', KEYS[3], id)
clear_lease(KEYS[1])
set_blob(KEYS[1], 'attachment', ARGV[5])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'carry', ARGV[6]) end

if limit and failures >= limit then
  redis.call('HSET', KEYS[1], 'state', 'dead', 'failures', failures,
    'note', ARGV[4], 'finished_at', now, 'updated_at', now)
  redis.call('ZADD', KEYS[5], now, id)
  journal(KEYS[2], now, 'failed', run, ARGV[4], ARGV[5], {'failures', failures})
  journal(KEYS[2], now, 'dead', run,
    'retry backstop: ' .. failures .. ' failed runs (max_failures=' .. limit .. ')', nil,
    {'reason', 'max_failures'})
  compact_journal(KEYS[2])
  offload_settle(ARGV[12], KEYS[1], id, 'failed', nil, ARGV[4], now)
  return {1, 'dead', 0, failures}
end

local delay = backoff_delay_ms(id, failures, tonumber(ARGV[7]), tonumber(ARGV[8]),
  tonumber(ARGV[9]))
local eligible = now + delay
redis.call('HSET', KEYS[1], 'state', 'pending', 'failures', failures,
  'note', ARGV[4], 'eligible_at', eligible, 'updated_at', now)
redis.call('ZADD', KEYS[4], eligible, id)
reindex(KEYS[6], KEYS[1], id)
journal(KEYS[2], now, 'failed', run, ARGV[4], ARGV[5],
  {'failures', failures, 'delay_ms', delay})
compact_journal(KEYS[2])
wake_workers(ARGV[11], 1)
return {1, 'pending', delay, failures}
