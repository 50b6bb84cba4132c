-- release: RUNNING -> PENDING on graceful shutdown. Not a failure: the
-- failure count is untouched and the carry is saved, so the next run
-- continues where this one stopped.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] running zset
-- KEYS[4] pending zset of the job's priority   KEYS[5] dedup index hash
-- ARGV[1] job id   ARGV[2] lease token   ARGV[3] now in ms or ''
-- ARGV[4] carry (msgpack or '')   ARGV[5] note   ARGV[6] wake list
--
-- Returns {1} on success, {0, reason} when refused.

-- @include common.lua

local id = ARGV[1]
local now = now_ms(ARGV[3])
local refused, run = check_owner(KEYS[1], KEYS[2], ARGV[2], 'release', now)
if refused then
  return {0, refused}
end
redis.call('ZREM', KEYS[3], id)
redis.call('HSET', KEYS[1], 'state', 'pending', 'eligible_at', now, 'updated_at', now)
clear_lease(KEYS[1])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'carry', ARGV[4]) end
redis.call('ZADD', KEYS[4], now, id)
reindex(KEYS[5], KEYS[1], id)
journal(KEYS[2], now, 'released', run, ARGV[5], nil)
compact_journal(KEYS[2])
wake_workers(ARGV[6], 1)
return {1}
