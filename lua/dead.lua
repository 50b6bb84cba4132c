-- dead: RUNNING -> DEAD at once: a permanent error, an unknown kind, or a
-- payload that does not decode. Counts as a failed run.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] running zset
-- KEYS[4] dead zset
-- ARGV[1] job id   ARGV[2] lease token   ARGV[3] now in ms or ''
-- ARGV[4] note   ARGV[5] attachment (msgpack or '')   ARGV[6] carry (msgpack or '')
-- ARGV[7] reason: permanent | unknown_kind | bad_payload
-- ARGV[8] key prefix of the queue (optional): when given and the job is an
--         offload, its snapshot becomes `failed` with the note as its error
--         and the redacted wake-up is published (include offload.lua)
--
-- Returns {1} on success, {0, reason} when refused.

-- @include common.lua
-- @include offload.lua

local id = ARGV[1]
local now = now_ms(ARGV[3])
local refused, run, f = check_owner(KEYS[1], KEYS[2], ARGV[2], 'dead', now, OFFLOAD_FIELDS)
if refused then
  return {0, refused}
end
redis.call('ZREM', KEYS[3], id)
redis.call('HINCRBY', KEYS[1], 'failures', 1)
redis.call('HSET', KEYS[1], 'state', 'dead', 'note', ARGV[4],
  'finished_at', now, 'updated_at', now)
clear_lease(KEYS[1])
set_blob(KEYS[1], 'attachment', ARGV[5])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'carry', ARGV[6]) end
redis.call('ZADD', KEYS[4], now, id)
journal(KEYS[2], now, 'dead', run, ARGV[4], ARGV[5], {'reason', ARGV[7]})
compact_journal(KEYS[2])
offload_settle(ARGV[8], KEYS[1], id, 'failed', nil, ARGV[4], now, {f[4], f[5]})
return {1}
