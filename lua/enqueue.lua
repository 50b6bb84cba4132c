-- enqueue: create one or more jobs, pending, in one atomic step.
--
-- KEYS[1]      dedup index hash
-- KEYS[2]      wake list: one token per job created (wake_workers, wake.lua)
-- KEYS[3]      queue meta hash (its `events`, `limits` and `history` fields)
-- KEYS[4+2i..] for job i (0-based): its job hash, the pending zset of its priority
-- KEYS[4+2n+i] with offload snapshots (ARGV[5] '1'): job i's snapshot key
-- ARGV has one of two layouts (calls.py enqueue picks, tests/test_layouts.py
-- checks). The short one, for a single job with no optional field, dedup
-- mode 'nx' and no offload (what a plain `queue.enqueue(task)` sends):
-- ARGV[1]      now in ms, or '' for Redis TIME
-- ARGV[2..7]   the job's six fixed values (job_args.lua: id .. payload; no m)
-- The prefix is then the meta key's (KEYS[3], prefix .. 'meta'). Six strings
-- fewer than the general layout's twelve: Redis builds ARGV as a Lua table
-- one string at a time (~1,300 instructions each, parsing included; a
-- single enqueue's -5%, benchmarks/README.md "Session 24"). The general one:
-- ARGV[1]      now in ms, or '' for Redis TIME
-- ARGV[2]      key prefix of the queue ("venturi:{q}:")
-- ARGV[3]      number of jobs n
-- ARGV[4]      dedup mode: 'nx' = take a dedup field only if free (a holder
--              is reported back, nothing written for that job); 'force' = point
--              the field at the new job (Merge.independent: newest pending wins)
-- ARGV[5]      '1' when every job of the call is an @vr.offload call's: each
--              job's pairs are then followed by its snapshot's token and
--              retention in ms, and the pending snapshot is written with the
--              job (include offload_pending.lua), never for a job that collided
-- ARGV[6..]    per job, job_args.lua's layout (JOB_ARGS: id, kind, priority,
--              delay_ms, dedup field, payload, m, then m optional field, value pairs)
-- The journal is not written here: the hash holds what its `enqueued` entry
-- would say (journal.lua). The event stream (while events are on: the meta
-- hash's `events`, include events.lua) gets one entry per call, `enqueued`,
-- and the metrics history (its `history`, include history.lua) the count of
-- the jobs created, by kind.
-- A job of a limited kind (the meta hash's `limits` on, its kind in the
-- limits hash: keys.lua feature_keys), eligible now, is parked instead of put
-- in its pending set, so a claim never scans it (include limits.lua).
--
-- A job with an order key (its first optional pair `order_key`,
-- Prepared.optional; order.lua's arrive and broken, inline) holds its key and goes to its
-- pending set when the key is free, else waits in the key's queue
-- (`ordered`), in no pending set. The order keys are checked before the
-- call's first write (a damaged one: VR_WRONGTYPE, nothing written), and
-- only for a call that has an ordered job.
--
-- Returns {now, r1, ..., rn}: ri is '' when job i was created, or the id of
-- the pending job already holding its dedup field (nothing written for i);
-- for one job (n = 1), r1 alone (a string: a table reply costs Redis more
-- to build than the rest of a small call's reply).
-- Errors: VR_WRONGTYPE when an order key of the queue is damaged and the
-- call has an ordered job (nothing written); every other precondition is
-- the dedup check, made before any write for that job.
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
-- @include keys.lua
-- @include dedup.lua
-- @include wake.lua
-- @include offload_pending.lua
-- @include events.lua
-- @include job_args.lua
-- @include history.lua

-- What only some enqueues need: flow control's and order keys' names, a
-- resend's dedup clean-up, an offload's snapshot, the many-jobs event, the
-- metrics history. Made by lib() at the first use in a call (L): each
-- function a script defines at its top is a closure made on every call,
-- and a single enqueue needs none of these (benchmarks/README.md, "Session 22").
local L = nil
local function lib()
  -- @lib (scripts.py prune: the helpers only this needs are made here)
  return {feature_keys = feature_keys, unindex = unindex, offload_pending = offload_pending,
    emit_many = emit_many, job_extra = job_extra, history_flush = history_flush}
end

local now = now_ms(ARGV[1])
local now_s = str(now)
local prefix, n, force, offload, a
if ARGV[8] == nil then -- the short layout: one job, no pairs, 'nx', no offload
  prefix, n, force, offload, a = string.sub(KEYS[3], 1, -5), 1, false, false, 2
else
  prefix, n, force, offload, a = ARGV[2], tonumber(ARGV[3]), ARGV[4] == 'force', ARGV[5] == '1', 6
end
local meta = redis.call('HMGET', KEYS[3], 'events', 'limits', 'history')
events_open(KEYS[3], events_key(prefix), prefix, meta[1] or false)
history_counts = meta[3] == '1' and {} or nil
local fk = nil -- flow control's keys, while limits are on
if meta[2] == '1' then
  L = L or lib()
  fk = L.feature_keys(prefix)
end
local one = n == 1
local out = one and nil or {now}
local created = 0
local ids, kinds, runs = nil, nil, nil -- the `enqueued` event's, for many jobs
if events_stream and not one then ids, kinds, runs = {}, {}, {} end
-- Ordered jobs: the order keys checked before the first write. order.lua's
-- helpers inline, here and below: its closure would cost every enqueue.
-- One job: its first optional pair is ARGV[13] (an offload token, there
-- when it has none, is never 'order_key'); many: a walk of their layouts.
local ok = nil -- feature_keys(prefix), for a call with an ordered job
local ordered = false
if n == 1 then
  ordered = ARGV[13] == 'order_key' -- nil in the short layout
else
  local b = 6
  for _ = 1, n do
    local m = tonumber(ARGV[b + 6])
    if m > 0 and ARGV[b + 7] == 'order_key' then
      ordered = true
      break
    end
    b = b + 7 + 2 * m + (offload and 2 or 0)
  end
end
if ordered then
  L = L or lib()
  ok = L.feature_keys(prefix)
  local broken = nil
  if type(redis.pcall('HLEN', ok.order_held)) == 'table' then
    broken = ok.order_held .. ' is not a hash'
  elseif type(redis.pcall('ZCARD', ok.order_queue)) == 'table' then
    broken = ok.order_queue .. ' is not a sorted set'
  elseif type(redis.pcall('SCARD', ok.order_paused)) == 'table' then
    broken = ok.order_paused .. ' is not a set'
  else
    local seq = redis.pcall('GET', ok.order_seq)
    if type(seq) == 'table' or (seq and not string.match(seq, '^%d+$')) then
      broken = ok.order_seq .. ' is not a counter'
    end
  end
  if broken then return redis.error_reply('VR_WRONGTYPE ' .. broken) end
end
for i = 0, n - 1 do
  local id, kind, priority, delay, field, payload, m, first = job_at(a)
  a = first + 2 * m
  local token, ttl = nil, nil
  if offload then
    token, ttl = ARGV[a], ARGV[a + 1]
    a = a + 2
  end
  local job_key, pending = KEYS[4 + 2 * i], KEYS[5 + 2 * i]
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
  if holder == '' and redis.call('EXISTS', job_key) == 1 then
    -- A resend whose job exists (without a dedup key, or after it was claimed).
    holder = false
    if field ~= '' and redis.call('HGET', job_key, 'state') ~= 'pending' then
      L = L or lib()
      L.unindex(KEYS[1], field, id)
    end
  end
  if holder == '' then
    local eligible_s = delay == '0' and now_s or str(now + tonumber(delay))
    local member = ''
    if ok and m > 0 and ARGV[first] == 'order_key' then
      -- It holds its key when the key is free and not paused, else waits at
      -- the end of the key's line (order.lua's arrive).
      local okey = ARGV[first + 1]
      if not redis.call('HGET', ok.order_held, okey)
          and redis.call('SISMEMBER', ok.order_paused, okey) == 0 then
        redis.call('HSET', ok.order_held, okey, id)
      else
        member = okey .. '\255' .. string.format('%016d', redis.call('INCR', ok.order_seq)) .. id
        redis.call('ZADD', ok.order_queue, 0, member)
      end
    end
    write_job(prefix, id, job_key, 'pending', kind, priority, eligible_s, now_s, payload, field, first, m)
    if member ~= '' then
      -- Waits on its key: in no pending set until its key lets it go.
      redis.call('HSET', job_key, 'ordered', member)
    elseif fk and delay == '0' and redis.call('HEXISTS', fk.limits, kind) == 1 then
      -- limits.lua's limit_park, inline: a helper (its closure, its level
      -- table) would cost every enqueue, limited or not.
      local level = priority == 'critical' and '0' or priority == 'high' and '1'
        or priority == 'low' and '3' or '2'
      L = L or lib()
      local entity = kind .. '\t' .. L.job_extra(first, m, 'limit_key')
      local member = entity .. '\t' .. level .. id
      redis.call('ZADD', fk.limits_parked, 0, member)
      redis.call('ZADD', fk.limits_ready, 'NX', now_s, entity)
      redis.call('HSET', job_key, 'parked', member)
    else
      redis.call('ZADD', pending, eligible_s, id)
    end
    if offload then
      L = L or lib()
      L.offload_pending(KEYS[4 + 2 * n + i], job_key, id, kind, token, ttl, now)
    end
    created = created + 1
    if history_counts then
      local field = kind .. '\tenqueued'
      history_counts[field] = (history_counts[field] or 0) + 1
    end
    if events_stream then
      if one then
        -- One job: its entry straight away (events.lua's one-job form, with
        -- its priority and eligibility), no tables built for it.
        events_checked(redis.pcall('XADD', events_stream, 'MAXLEN', '~', events_cap, '*', 'event',
          'enqueued', 'job', id, 'kind', kind, 'at', now_s, 'run', '0', 'priority', priority,
          'eligible_at', eligible_s))
      else
        ids[created], kinds[created], runs[created] = id, kind, 0
      end
    end
  end
  if one then
    if created > 0 then
      wake_workers(KEYS[2], 1)
      if history_counts then (L or lib()).history_flush(prefix, now) end
    end
    return holder or ''
  end
  out[#out + 1] = holder or ''
end
if created > 0 then
  wake_workers(KEYS[2], created)
  if events_stream then
    L = L or lib()
    L.emit_many('enqueued', now_s, ids, kinds, runs)
  end
  if history_counts then (L or lib()).history_flush(prefix, now) end
end
return out
