-- enqueue: create one or more jobs, pending, in one atomic step.
--
-- KEYS[1]      dedup index hash
-- KEYS[2]      wake list: one token per job created (wake_workers, wake.lua)
-- KEYS[3+3i..] for job i (0-based): job hash, journal stream, pending zset of its priority.
--              The journal stream is not written here: the hash holds what its
--              `enqueued` entry would say, and the job's first journaled event
--              writes that entry first (materialize, journal.lua). A one-entry
--              stream costs ~4.7 KB on Redis 7.0, ten times the rest of the job.
-- ARGV[1]      now in ms, or '' for Redis TIME
-- ARGV[2]      key prefix of the queue (events.lua takes its length)
-- ARGV[3]      number of jobs n
-- ARGV[4]      dedup mode: 'nx' = take a dedup field only if free (a holder
--              is reported back, nothing written for that job); 'force' = point
--              the field at the new job (Merge.independent: newest pending wins).
--              A trailing '+' ('nx+', 'force+'): the extended layout below.
-- ARGV[5..]    f = 9 fields per job: id, kind, priority, delay_ms, payload, carry,
--              lease_ms ('' = worker default), max_failures ('' = worker
--              default, 'none' = no backstop), dedup field ('' = no dedup);
--              extended, f = 11: then timeout_ms ('' = the worker's) and the
--              limit key field ('' = none).
-- Optional offload snapshots (@vr.offload): when #KEYS == 4 + 4n (+3 extended),
-- KEYS[3+3n+i] is job i's snapshot key and ARGV[5+fn+2i], ARGV[6+fn+2i] are
-- its token and retention in ms; the pending snapshot is written with the job
-- (include offload_pending.lua), never for a job that collided.
-- Optional trace contexts (venturi_redis.otel): when ARGV holds n more values
-- after the rest, the last n are job i's W3C trace context, stored in its
-- hash as `trace` ('' = none).
-- Extended only, three KEYS before the last two: the limits hash,
-- limits:parked and limits:ready (lua/include/limits.lua). A job of a limited
-- kind, eligible now, is parked there instead of put in its pending set, so a
-- claim never scans it. The client sends the extended layout when a job of
-- the call has a timeout or a limit key: the common call pays for neither
-- (three keys and two fields cost a one-job enqueue ~11% of Redis's
-- instructions). A job of a limited kind sent without is parked by the claim
-- that first reaches it.
-- The last two KEYS: the queue meta hash and the event stream (include
-- events.lua: each job created is an `enqueued` event).
--
-- Returns {now, r1, ..., rn}: ri is '' when job i was created, or the id of
-- the pending job already holding its dedup field (nothing written for i).
-- Errors: none; every precondition is the dedup check, made before any write
-- for that job.
--
-- A resend is a no-op. Job ids are fresh per enqueue call, so a job hash
-- that already exists, or a dedup field that already names this very id,
-- was written by an earlier send of the same call: a client that resends a
-- command whose reply it lost (redis-py's cluster client does by default)
-- must not put a claimed job back to pending, nor merge a job into itself.
-- Such a job is reported created ('') and nothing is written for it, except
-- that a dedup field this send took again is given back when the job has
-- left pending since (it was freed at claim).

-- @include clock.lua
-- @include dedup.lua
-- @include wake.lua
-- @include offload_pending.lua
-- @include events.lua

local now = now_ms(ARGV[1])
local now_s = str(now)
local n = tonumber(ARGV[3])
local mode = ARGV[4]
local extended = mode == 'nx+' or mode == 'force+'
local force = mode == 'force' or mode == 'force+'
local fields, base = 9, 4
local limits_key, parked_key, ready_key
local limited = false -- whether the limits hash exists: learnt with the first job's EXISTS
if extended then
  fields, base = 11, 7
  limits_key, parked_key, ready_key = KEYS[#KEYS - 4], KEYS[#KEYS - 3], KEYS[#KEYS - 2]
  limited = nil
end
local with_offload = #KEYS == base + 4 * n
local trace_at = 5 + fields * n + (with_offload and 2 * n or 0) -- job i's trace: ARGV[trace_at + i]
local with_trace = #ARGV == trace_at - 1 + n
-- Whether the event stream exists (events.lua: no stream, no events), learnt
-- with the first job's EXISTS; only then is the switch read (events_open).
local events_seen = nil
local out = {now}
local created = 0
for i = 0, n - 1 do
  local a = 5 + i * fields
  local id, kind, priority = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local delay = ARGV[a + 3] -- '0' for most jobs: compared as a string, no tonumber
  local payload, carry, lease, maxf, field =
    ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7], ARGV[a + 8]
  local timeout, limit_key = '', ''
  if extended then timeout, limit_key = ARGV[a + 9], ARGV[a + 10] end
  local job_key, pending = KEYS[3 + i * 3], KEYS[5 + i * 3]
  local holder = ''
  if field ~= '' then
    if force then
      redis.call('HSET', KEYS[1], field, id)
    elseif redis.call('HSETNX', KEYS[1], field, id) == 0 then
      holder = redis.call('HGET', KEYS[1], field)
      if holder == id then
        holder = false -- a resend: the job is ours and exists
      end
    end
  end
  local exists = 0
  if holder == '' then
    if limited == nil then
      -- One EXISTS for the job key and the limits hash: with no limits
      -- defined (the common case) it answers both at once.
      exists = redis.call('EXISTS', job_key, limits_key)
      if exists == 0 then
        limited = false
      else
        limited = redis.call('EXISTS', limits_key) == 1
        if limited then exists = exists - 1 end
      end
    elseif events_seen == nil then
      -- The same for the event stream: with events off (the default, and
      -- then no stream) the one EXISTS answers both, and no HGET of the
      -- switch is made: the off path costs enqueue nothing but this key.
      exists = redis.call('EXISTS', job_key, KEYS[#KEYS])
      if exists == 0 then
        events_seen = false
      else
        events_seen = redis.call('EXISTS', KEYS[#KEYS]) == 1
        if events_seen then exists = exists - 1 end
      end
      if events_seen then events_open(KEYS[#KEYS - 1], KEYS[#KEYS], ARGV[2]) end
    else
      exists = redis.call('EXISTS', job_key)
    end
  end
  if exists == 1 then
    -- A resend whose job exists (without a dedup key, or after it was claimed).
    holder = false
    if field ~= '' and redis.call('HGET', job_key, 'state') ~= 'pending' then
      unindex(KEYS[1], field, id)
    end
  end
  if holder == '' then
    local eligible_s = delay == '0' and now_s or str(now + tonumber(delay))
    -- Only what is not derivable: the id is in the key, and run_count,
    -- failures (absent = 0) and updated_at (absent = created_at) are written
    -- by the first script that changes them: ~90 B less per pending job (W6).
    redis.call('HSET', job_key,
      'kind', kind, 'state', 'pending', 'priority', priority,
      'eligible_at', eligible_s, 'created_at', now_s, 'payload', payload)
    if carry ~= '' then redis.call('HSET', job_key, 'carry', carry) end
    if lease ~= '' then redis.call('HSET', job_key, 'lease_ms', lease) end
    if maxf ~= '' then redis.call('HSET', job_key, 'max_failures', maxf) end
    if field ~= '' then redis.call('HSET', job_key, 'dedup', field) end
    if with_trace and ARGV[trace_at + i] ~= '' then
      redis.call('HSET', job_key, 'trace', ARGV[trace_at + i])
    end
    if timeout ~= '' then redis.call('HSET', job_key, 'timeout_ms', timeout) end
    if limit_key ~= '' then redis.call('HSET', job_key, 'limit_key', limit_key) end
    if limited and delay == '0' and redis.call('HEXISTS', limits_key, kind) == 1 then
      -- limits.lua's limit_park, inline: a helper (its closure, its level
      -- table) would cost every enqueue, limited or not.
      local level = priority == 'critical' and '0' or priority == 'high' and '1'
        or priority == 'low' and '3' or '2'
      local entity = kind .. '\t' .. limit_key
      local member = entity .. '\t' .. level .. id
      redis.call('ZADD', parked_key, 0, member)
      redis.call('ZADD', ready_key, 'NX', now_s, entity)
      redis.call('HSET', job_key, 'parked', member)
    else
      redis.call('ZADD', pending, eligible_s, id)
    end
    if with_offload then
      local o = 5 + fields * n + 2 * i
      offload_pending(KEYS[3 + 3 * n + i], job_key, id, kind, ARGV[o], ARGV[o + 1], now)
    end
    created = created + 1
    if events_seen == nil then -- the first job's EXISTS went to the limits hash
      events_seen = redis.call('EXISTS', KEYS[#KEYS]) == 1
      if events_seen then events_open(KEYS[#KEYS - 1], KEYS[#KEYS], ARGV[2]) end
    end
    if events_stream then
      emit(id, kind, 'enqueued', now_s, 0, nil, {'priority', priority, 'eligible_at', eligible_s})
    end
  end
  out[#out + 1] = holder or ''
end
if created > 0 then
  wake_workers(KEYS[2], created)
end
return out
