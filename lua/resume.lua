-- resume: SUSPENDED -> PENDING with an input for the next run.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] suspended zset
-- KEYS[4] dedup index hash
-- ARGV[1] job id   ARGV[2] now in ms or ''   ARGV[3] resume input (msgpack)
-- ARGV[4] key prefix of the queue (the job's pending set derives from it)
-- ARGV[5] wake list
--
-- Returns 1, or 0 when the job is unknown or not suspended (nothing written).

-- @include common.lua

local id = ARGV[1]
local f = redis.call('HMGET', KEYS[1], 'state', 'priority', 'run_count')
if f[1] ~= 'suspended' then
  return 0
end
local now = now_ms(ARGV[2])
redis.call('ZREM', KEYS[3], id)
redis.call('HSET', KEYS[1], 'state', 'pending', 'resume_input', ARGV[3],
  'eligible_at', now, 'updated_at', now)
redis.call('ZADD', ARGV[4] .. 'pending:' .. f[2], now, id)
reindex(KEYS[4], KEYS[1], id)
journal(KEYS[2], now, 'resumed', f[3], nil, ARGV[3])
wake_workers(ARGV[5], 1)
return 1
