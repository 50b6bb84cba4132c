-- cancel: PENDING or SUSPENDED -> CANCELLED at once (an operator's cancel);
-- RUNNING -> cancel requested (the worker is told through `extend` and asks
-- the handler to stop through its context); RUNNING -> CANCELLED for the
-- worker that holds the lease, once its handler has stopped.
--
-- KEYS[1] job hash   KEYS[2] journal stream   KEYS[3] suspended zset
-- KEYS[4] running zset   KEYS[5] cancelled zset   KEYS[6] dedup index hash
-- ARGV[1] job id   ARGV[2] now in ms or ''
-- ARGV[3] key prefix of the queue (the job's pending set derives from it)
-- ARGV[4] note (who cancelled, why)
-- ARGV[5] lease token: '' for an operator; the worker's token when the worker
--         ends its own run cancelled (then ARGV[6] attachment, ARGV[7] carry)
--
-- A cancelled offload job settles its snapshot as failed (offload.lua).
--
-- Returns {1, 'cancelled'} (the job is now cancelled), {1, 'requested'} (it
-- is running; its worker will stop it), or {0, reason} when nothing was done
-- (unknown job, already finished, or a stale lease token).

-- @include common.lua
-- @include offload.lua

local id = ARGV[1]
local now = now_ms(ARGV[2])
local token = ARGV[5]
local f = redis.call('HMGET', KEYS[1], 'state', 'priority', 'run_count', 'dedup', 'cancel_requested')
if not f[1] then
  return {0, 'job does not exist'}
end
local state = f[1]
-- A pending job never journaled gets its `enqueued` entry before any write
-- (the pending branch drops eligible_at).
materialize(KEYS[1], KEYS[2])

if state == 'running' and token == '' then
  -- Not ours to stop: flag it. The holder's next lease renewal sees the flag;
  -- a run that ends before noticing lands in pending and is cancelled by the
  -- claim that would have picked it up.
  if not f[5] then
    redis.call('HSET', KEYS[1], 'cancel_requested', now, 'updated_at', now)
    journal(KEYS[2], now, 'cancel_requested', f[3], ARGV[4], nil)
  end
  return {1, 'requested'}
end

if token ~= '' then
  local refused = check_owner(KEYS[1], KEYS[2], token, 'cancel', now)
  if refused then
    return {0, refused}
  end
  redis.call('ZREM', KEYS[4], id)
  clear_lease(KEYS[1])
  set_blob(KEYS[1], 'attachment', ARGV[6])
  if ARGV[7] ~= nil and ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'carry', ARGV[7]) end
elseif state == 'pending' then
  redis.call('ZREM', ARGV[3] .. 'pending:' .. f[2], id)
  unindex(KEYS[6], f[4], id)
elseif state == 'suspended' then
  redis.call('ZREM', KEYS[3], id)
else
  return {0, 'job is ' .. state}
end
redis.call('HSET', KEYS[1], 'state', 'cancelled', 'note', ARGV[4],
  'finished_at', now, 'updated_at', now)
redis.call('HDEL', KEYS[1], 'eligible_at')
redis.call('ZADD', KEYS[5], now, id)
journal(KEYS[2], now, 'cancelled', f[3], ARGV[4], nil, {'from', state})
compact_journal(KEYS[2])
-- An offload's caller is waiting in resolve(): settle its snapshot as failed.
offload_settle(ARGV[3], KEYS[1], id, 'failed', nil, 'cancelled: ' .. ARGV[4], now)
return {1, 'cancelled'}
