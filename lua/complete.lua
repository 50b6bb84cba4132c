-- complete: RUNNING -> COMPLETED, for the holder of the lease token only.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] running zset
-- KEYS[4] completed zset
-- ARGV[1] job id   ARGV[2] lease token   ARGV[3] now in ms or ''
-- ARGV[4] note     ARGV[5] attachment (msgpack or '')
-- ARGV[6] carry (msgpack or '')   ARGV[7] result (msgpack or '')
-- ARGV[8] key prefix of the queue (optional): when given and the job is an
--         offload, its snapshot becomes `completed` with the result and the
--         redacted wake-up is published (include offload.lua)
--
-- Returns {1} on success, {0, reason} when refused (stale or unknown job;
-- the refusal is journaled and nothing else is written).

-- @include common.lua
-- @include offload.lua

local id = ARGV[1]
local now = now_ms(ARGV[3])
local refused, run = check_owner(KEYS[1], KEYS[2], ARGV[2], 'complete', now)
if refused then
  return {0, refused}
end
redis.call('ZREM', KEYS[3], id)
redis.call('HSET', KEYS[1], 'state', 'completed', 'note', ARGV[4],
  'finished_at', now, 'updated_at', now)
clear_lease(KEYS[1])
set_blob(KEYS[1], 'attachment', ARGV[5])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'carry', ARGV[6]) end
set_blob(KEYS[1], 'result', ARGV[7])
redis.call('ZADD', KEYS[4], now, id)
journal(KEYS[2], now, 'completed', run, ARGV[4], ARGV[5])
offload_settle(ARGV[8], KEYS[1], id, 'completed', ARGV[7], nil, now)
return {1}
