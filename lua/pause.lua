-- pause: RUNNING -> PENDING after a cooperative pause (not a failure: the
-- failure count and the retry backstop are untouched).
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] running zset
-- KEYS[4] pending zset of the job's priority   KEYS[5] dedup index hash
-- ARGV[1] job id   ARGV[2] lease token   ARGV[3] now in ms or ''
-- ARGV[4] delay in ms   ARGV[5] note   ARGV[6] attachment (msgpack or '')
-- ARGV[7] carry (msgpack or '')   ARGV[8] wake list
--
-- Returns {1, eligible_at} on success, {0, reason} when refused.

-- @include common.lua

local id = ARGV[1]
local now = now_ms(ARGV[3])
local refused, run = check_owner(KEYS[1], KEYS[2], ARGV[2], 'pause', now)
if refused then
  return {0, refused}
end
local eligible = now + tonumber(ARGV[4])
redis.call('ZREM', KEYS[3], id)
redis.call('HSET', KEYS[1], 'state', 'pending', 'note', ARGV[5],
  'eligible_at', eligible, 'updated_at', now)
clear_lease(KEYS[1])
set_blob(KEYS[1], 'attachment', ARGV[6])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'carry', ARGV[7]) end
redis.call('ZADD', KEYS[4], eligible, id)
reindex(KEYS[5], KEYS[1], id)
journal(KEYS[2], now, 'paused', run, ARGV[5], ARGV[6], {'delay_ms', ARGV[4]})
compact_journal(KEYS[2])
wake_workers(ARGV[8], 1)
return {1, eligible}
