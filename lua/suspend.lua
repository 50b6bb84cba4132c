-- suspend: RUNNING -> SUSPENDED. The job waits, in no eligibility set and
-- holding no worker slot, until `resume` gives it an input.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] running zset
-- KEYS[4] suspended zset
-- ARGV[1] job id   ARGV[2] lease token   ARGV[3] now in ms or ''
-- ARGV[4] note   ARGV[5] attachment (msgpack or '')   ARGV[6] carry (msgpack or '')
-- ARGV[7] output (msgpack or '')
--
-- Returns {1} on success, {0, reason} when refused.

-- @include common.lua

local id = ARGV[1]
local now = now_ms(ARGV[3])
local refused, run = check_owner(KEYS[1], KEYS[2], ARGV[2], 'suspend', now)
if refused then
  return {0, refused}
end
redis.call('ZREM', KEYS[3], id)
redis.call('HSET', KEYS[1], 'state', 'suspended', 'note', ARGV[4], 'updated_at', now)
redis.call('HDEL', KEYS[1], 'resume_input', 'eligible_at')
clear_lease(KEYS[1])
set_blob(KEYS[1], 'attachment', ARGV[5])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'carry', ARGV[6]) end
set_blob(KEYS[1], 'output', ARGV[7])
redis.call('ZADD', KEYS[4], now, id)
journal(KEYS[2], now, 'suspended', run, ARGV[4], ARGV[5])
compact_journal(KEYS[2])
return {1}
