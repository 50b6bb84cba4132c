-- update: change a PENDING job in place: its task (payload, dedup key), its
-- priority, its eligibility. One atomic step; a job in any other state is
-- refused with nothing written.
--
-- KEYS[1] job hash   KEYS[2] journal stream
-- KEYS[3..6] pending zsets, CRITICAL first: the job's priority field picks its
--         own, the new priority the one it moves to
-- KEYS[7] dedup index hash   KEYS[8] wake list
-- KEYS[9] limits:parked zset: a job parked on a limit moves there to its new
--         priority, or back to its pending set when it is delayed
-- KEYS[10] retrying zset: a job waiting for its retry keeps its score there
--         equal to its eligibility
-- KEYS[11] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''   ARGV[2] key prefix of the queue
-- ARGV[3] job id
-- ARGV[4] the new task's KIND ('' = the task is unchanged)
-- ARGV[5] the new task's payload (msgpack)
-- ARGV[6] the new task's dedup field ('' = none)
-- ARGV[7] new priority label ('' = unchanged)
-- ARGV[8] new delay in ms from now ('' = unchanged)
--
-- Returns {1} when updated; {0, reason} when the job is unknown or not
-- pending; {2, kind} when the new task's KIND is not the job's; {3, holder}
-- when the new dedup key is held by another job; {4, order key} when the new
-- task has a dedup key and the job an order key (nothing written for any of
-- these: the client raises ConfigurationError for 2, 3 and 4).
-- A job waiting on its order key (its `ordered` field) keeps its place in
-- the key's line: a new priority or eligibility is written to its hash, and
-- its pending set takes it when the key lets it go (order.lua). Its order
-- key itself never changes here.
-- The journal gets one entry, `updated`, naming what changed (`changed`:
-- task, dedup, priority, eligible_at, comma-separated) and the new values.
-- Errors: VR_CORRUPTJOB when the job's own data is corrupt (its job key not a
-- hash, its journal not a stream, no state field, a priority that names no
-- pending set: operator.lua); VR_WRONGTYPE when the dedup index is not a hash;
-- nothing written.

-- @include clock.lua
-- @include keys.lua
-- @include journal.lua
-- @include dedup.lua
-- @include wake.lua
-- @include limits.lua
-- @include operator.lua

local id = ARGV[3]
local f, corrupt = read_job(KEYS[1], KEYS[2], {'state', 'run_count', 'priority', 'parked', 'kind', 'dedup',
  'order_key', 'ordered'})
if corrupt then
  return corrupt_job(id, corrupt)
end
if not f[1] then
  return {0, 'job does not exist'}
end
if f[1] ~= 'pending' then
  return {0, 'job is ' .. f[1]}
end
local old_priority = f[3] or 'normal'
local from = pending_key(3, old_priority)
if not from then
  return corrupt_job(id, bad_priority(f[3]))
end
local kind, payload, field = ARGV[4], ARGV[5], ARGV[6]
local new_priority = ARGV[7] ~= '' and ARGV[7] or old_priority
local to = pending_key(3, new_priority)
local old_field = f[6] or ''
local moves_key = kind ~= '' and field ~= old_field
-- Every check before the first write.
if kind ~= '' and kind ~= f[5] then
  return {2, f[5] or ''}
end
-- A job with an order key takes no dedup key (docs/semantics.md, "Ordered keys").
if moves_key and field ~= '' and f[7] then
  return {4, f[7]}
end
if moves_key and field ~= '' then
  local holder = redis.pcall('HGET', KEYS[7], field)
  if type(holder) == 'table' and holder.err then
    return redis.error_reply('VR_WRONGTYPE ' .. KEYS[7] .. ' is not a hash')
  end
  if holder and holder ~= id then
    return {3, holder}
  end
elseif moves_key and type(redis.pcall('HLEN', KEYS[7])) == 'table' then
  return redis.error_reply('VR_WRONGTYPE ' .. KEYS[7] .. ' is not a hash')
end
for _, set in ipairs({from, to}) do
  if type(redis.pcall('ZCARD', set)) == 'table' then
    return redis.error_reply('VR_WRONGTYPE ' .. set .. ' is not a sorted set')
  end
end
local now = now_ms(ARGV[1])
-- Journal the `enqueued` entry first if nothing has yet, while the hash still
-- holds what it says.
materialize(KEYS[1], KEYS[2])
local changed, extra = {}, {}
if kind ~= '' then
  redis.call('HSET', KEYS[1], 'payload', payload)
  changed[#changed + 1] = 'task'
  if moves_key then
    unindex(KEYS[7], old_field, id)
    if field ~= '' then
      redis.call('HSET', KEYS[7], field, id)
      redis.call('HSET', KEYS[1], 'dedup', field)
    else
      redis.call('HDEL', KEYS[1], 'dedup')
    end
    changed[#changed + 1] = 'dedup'
    extra[#extra + 1] = 'dedup'
    extra[#extra + 1] = field
  end
end
local parked = f[4]
local waits = f[8] -- waiting on its order key: in no pending set, its place kept (order.lua)
if new_priority ~= old_priority then
  if waits then
    -- Its new priority's set takes it when its key lets it go.
  elseif parked then
    -- <entity>\t<level><id>: the same entity, the new level (as merge.lua).
    local lim = limits_lib()
    local member = string.sub(parked, 1, #parked - #id - 1) .. (lim.LEVEL[new_priority] or '2') .. id
    lim.unpark(KEYS[9], parked)
    redis.call('ZADD', KEYS[9], 0, member)
    redis.call('HSET', KEYS[1], 'parked', member)
    parked = member
  else
    local score = redis.call('ZSCORE', from, id) or str(now)
    redis.call('ZREM', from, id)
    redis.call('ZADD', to, score, id)
  end
  redis.call('HSET', KEYS[1], 'priority', new_priority)
  changed[#changed + 1] = 'priority'
  extra[#extra + 1] = 'priority'
  extra[#extra + 1] = new_priority
end
if ARGV[8] ~= '' then
  local eligible = str(now + tonumber(ARGV[8]))
  if parked then
    -- Parked jobs were eligible: back to the pending set, parked again by the
    -- claim once due.
    limits_lib().unpark(KEYS[9], parked)
    redis.call('HDEL', KEYS[1], 'parked')
  end
  if not waits then
    redis.call('ZADD', to, eligible, id)
    redis.pcall('ZADD', KEYS[10], 'XX', eligible, id) -- an index only: its type does not stop the update
  end
  redis.call('HSET', KEYS[1], 'eligible_at', eligible)
  changed[#changed + 1] = 'eligible_at'
  extra[#extra + 1] = 'eligible_at'
  extra[#extra + 1] = eligible
end
redis.call('HSET', KEYS[1], 'updated_at', now)
table.insert(extra, 1, table.concat(changed, ','))
table.insert(extra, 1, 'changed')
journal(KEYS[2], now, 'updated', f[2], nil, nil, extra)
compact_journal(KEYS[2])
wake_workers(KEYS[8], 1)
return {1}
