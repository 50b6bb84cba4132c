-- claim: move up to `count` eligible jobs from pending to running, highest
-- priority first; within a level, earliest eligibility first, ties in id
-- (ULID, so creation) order.
--
-- KEYS[1..4] pending zsets, CRITICAL, HIGH, NORMAL, LOW
-- KEYS[5]    running zset (scored by lease expiry)
-- KEYS[6]    dedup index hash
-- KEYS[7]    queue meta hash (fields `paused`, `events`, `limits`)
-- KEYS[8]    wake list (wake.lua wake_workers): deleted when the claim
--            comes back short or the queue is paused, since every token in it
--            is stale then (whatever enqueue pushed it for is claimed, or not
--            eligible yet, and this claim's `next` covers that)
-- KEYS[9]    cancelled zset: a pending job whose cancel was requested while
--            it ran (cancel.lua) is cancelled here instead of claimed
-- KEYS[10]   dead zset: a pending job whose own data is corrupt is
--            quarantined there (quarantine.lua) instead of claimed
--            (either way, a job others wait on is added to the `graph:orphans`
--            set, keys.lua: the next reclaim sweep tells its dependents)
-- KEYS[11]   optional: the claiming worker's stop list. An idle worker sends
--            this claim pipelined behind `BLPOP wake stop`; to stop it, the
--            worker pushes two tokens onto its stop list: BLPOP takes one and
--            this claim, finding the other, deletes the list and claims nothing
-- ARGV[1]    now in ms, or ''
-- ARGV[2]    key prefix of the queue ("venturi:{q}:"); job keys derive from it
-- ARGV[3]    count
-- ARGV[4]    worker id (stored as lease_owner, journaled)
-- ARGV[5]    lease token base; job k of this batch gets token base .. '.' .. k
-- ARGV[6]    default lease in ms (a job's own lease_ms wins)
-- The event stream (include events.lua) and flow control's limits hash,
-- limits:state hash, limits:parked and limits:ready zsets (include
-- limits.lua) are reached only while the meta hash's `events` / `limits`
-- field is on (limit.lua sets `limits`), their names derived from the prefix
-- then (keys.lua feature_keys): not in KEYS, which every call pays for.
--
-- Returns {now, next, job...}: `next` is the earliest eligible_at still
-- pending when fewer than `count` jobs were claimed (0 = none; -1 = the queue
-- is paused). Each job is 13 values: id, kind, payload, carry, run_count,
-- failures, token, lease_ms, priority, max_failures, resume_input, history
-- (the journal before this claim, as XRANGE returns it; for a first claim,
-- whose journal is only the `enqueued` entry it has just written, that
-- entry's values instead: {created_at, priority, eligible_at}, which the
-- client turns into the same entry, _records.py claim_history), timeout_ms
-- ('' = the worker's timeout; calls.py ClaimReply reads 13 per job).
--
-- Errors: VR_WRONGTYPE when a pending or the running set is not a sorted set.
-- Each job is read and checked before anything is written for it, so no job
-- is left half moved: the claim stops at the broken key, and returns the jobs
-- it claimed before it, or, when it claimed none, the error.

-- Flow control (docs/flow-control.md): when limits are on, the claim first
-- takes from the ready rotation of limited entities (the kind, or kind and
-- key, whose cap has room: the entity least recently served first), then
-- scans the pending sets, where a job of a limited kind is parked (once: it
-- is not in a pending set any more) instead of claimed; entities it parked
-- are then served in the same call. A blocked entity is not in the rotation
-- until the script that frees its slot, or the end of its rate window,
-- makes it ready again: its parked jobs are never scanned meanwhile.

-- @include clock.lua
-- @include keys.lua
-- @include journal.lua
-- @include dedup.lua
-- @include finish.lua
-- @include quarantine.lua
-- @include graph.lua
-- @include limits.lua

local now = now_ms(ARGV[1])
local now_s = str(now)
local prefix = ARGV[2]
local want = tonumber(ARGV[3])
local worker = ARGV[4]
local default_lease = tonumber(ARGV[6])

if KEYS[11] and redis.call('DEL', KEYS[11]) == 1 then
  return {now, 0}
end

local meta = redis.call('HMGET', KEYS[7], 'paused', 'events', 'limits')
if meta[1] == '1' then
  redis.call('DEL', KEYS[8])
  return {now, -1}
end
local limits_on = meta[3] == '1'
-- The feature keys (fk) and flow control's helpers (lim), made only when on.
local fk, lim = nil, nil
if limits_on or (meta[2] or EVENTS_DEFAULT) ~= '0' then fk = feature_keys(prefix) end
if limits_on then lim = limits_lib() end

if fk then events_open(KEYS[7], fk.events, prefix, meta[2] or false) end

-- An idle queue (every pending set empty; Redis deletes an empty set) is
-- answered with one EXISTS instead of a ZRANGE per level.
if limits_on then
  if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4], fk.limits_ready) == 0 then
    redis.call('DEL', KEYS[8])
    return {now, 0}
  end
elseif redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4]) == 0 then
  redis.call('DEL', KEYS[8])
  return {now, 0}
end

local out = {now, 0}
local n = 0
local nxt = 0
local broken = nil -- a queue-wide key of the wrong type: the claim stops there
-- Flow control's own helpers (config_of: a kind's limit config, read once
-- per call, false for none; claim_limited below) are made only when limits
-- are on: each function defined is a closure made per call.
local config_of, claim_limited = nil, nil
if limits_on then
  local configs = {}
  config_of = function(kind)
    local c = configs[kind]
    if c == nil then
      local raw = redis.call('HGET', fk.limits, kind)
      c = raw and lim.config(raw) or false
      configs[kind] = c
    end
    return c
  end
end

-- Claim the pending job `id` (found in the set `from`, or parked when `from`
-- is nil). Everything its claim depends on is read and checked first.
-- Returns 'claimed', 'parked' (a limited kind: parked instead), or 'dropped'
-- (dropped, cancelled or quarantined); sets `broken` when the running set is
-- of the wrong type (nothing written for the job).
local function take(id, from)
  local job_key, journal_key = job_keys(prefix, id)
  local f = redis.pcall('HMGET', job_key, 'kind', 'payload', 'carry', 'run_count',
    'failures', 'lease_ms', 'priority', 'max_failures', 'resume_input', 'dedup', 'state',
    'cancel_requested', 'created_at', 'eligible_at', 'timeout_ms')
  local bad = nil
  local first, history = false, nil
  if f.err then
    bad = 'job key is not a hash'
  elseif not f[11] then
    -- No state: corrupt while any other field is left (gone when none is).
    for i = 1, #f do
      if f[i] then
        bad = 'state field is missing'
        break
      end
    end
  elseif f[11] ~= 'pending' then
    bad = 'state is ' .. f[11] .. ' while in a pending set'
  elseif not f[1] then
    bad = 'kind field is missing'
  elseif not PRIORITY_LEVEL[f[7] or ''] then
    bad = bad_priority(f[7])
  elseif from and limits_on and config_of(f[1]) then
    -- A limited kind: parked, to be claimed through the rotation.
    redis.call('ZREM', from, id)
    local key = redis.call('HGET', job_key, 'limit_key')
    lim.park(fk.limits_parked, fk.limits_ready, job_key, lim.entity(f[1], key), f[7], id, now_s)
    return 'parked'
  elseif redis.call('EXISTS', journal_key) == 0 then
    -- Claimed (or cancelled) for the first time: the `enqueued` entry
    -- enqueue did not write goes first, from created_at, which must be a time.
    if is_time(f[13]) then first = true else bad = 'created_at field is not a time in ms' end
  elseif not f[12] then
    history = redis.pcall('XRANGE', journal_key, '-', '+')
    if history.err then bad = 'journal key is not a stream' end
  end
  if bad then
    if from then redis.call('ZREM', from, id) end
    quarantine(job_key, journal_key, KEYS[10], id, now_s, bad)
    if not f.err then graph_orphaned(prefix, job_key, id) end
    return 'dropped'
  elseif not f[11] then
    -- A pending id whose hash is gone (removed by hand) is dropped.
    if from then redis.call('ZREM', from, id) end
    return 'dropped'
  elseif f[12] then
    -- An operator cancelled it while it ran, and that run ended (failed,
    -- paused, released, reclaimed) before its worker noticed: finish the
    -- cancel here instead of running it again.
    if from then redis.call('ZREM', from, id) else redis.call('HDEL', job_key, 'parked') end
    if first then write_enqueued(journal_key, {f[13], f[7], f[14]}) end
    unindex(KEYS[6], f[10], id)
    finish_cancelled(prefix, job_key, journal_key, KEYS[9], id, now_s, f[4],
      'cancel requested while running', 'pending')
    graph_orphaned(prefix, job_key, id)
    return 'dropped'
  end
  local lease = tonumber(f[6]) or default_lease
  local expires_s = str(now + lease)
  -- The running set first: a wrong-type one fails here, before any
  -- write for this job, and the claim stops with what it has.
  local added = redis.pcall('ZADD', KEYS[5], expires_s, id)
  if type(added) == 'table' and added.err then
    broken = KEYS[5] .. ' is not a sorted set'
    return 'dropped'
  end
  if from then redis.call('ZREM', from, id) end
  if first then
    -- Before any write to its hash, so the history returned below
    -- starts with it (and is only that entry, sent as its three
    -- values: a nested reply costs Redis more to build).
    write_enqueued(journal_key, {f[13], f[7], f[14]})
    history = {f[13], f[7] or '', f[14] or ''}
  end
  n = n + 1
  local run = (tonumber(f[4]) or 0) + 1
  local run_s = str(run)
  local token = ARGV[5] .. '.' .. str(n)
  redis.call('HSET', job_key, 'state', 'running', 'run_count', run_s,
    'lease_owner', worker, 'lease_token', token, 'lease_expires', expires_s,
    'updated_at', now_s)
  if not from then redis.call('HDEL', job_key, 'parked') end
  if (tonumber(f[5]) or 0) > 0 then redis.call('ZREM', retrying_key(prefix), id) end
  unindex(KEYS[6], f[10], id)
  journal(journal_key, now_s, 'claimed', run_s, nil, nil, {'worker', worker})
  local o = #out
  out[o + 1] = id
  out[o + 2] = f[1]
  out[o + 3] = f[2] or ''
  out[o + 4] = f[3] or ''
  out[o + 5] = run
  out[o + 6] = tonumber(f[5]) or 0
  out[o + 7] = token
  out[o + 8] = lease
  out[o + 9] = f[7]
  out[o + 10] = f[8] or ''
  out[o + 11] = f[9] or ''
  out[o + 12] = history
  out[o + 13] = f[15] or ''
  return 'claimed'
end

-- The ready rotation of limited entities: the one waiting longest first.
-- An entity whose cap has room gives its first parked job (priority, then
-- creation) and goes to the back (scored now); one at its cap waits at
-- LIMIT_BLOCKED or at the end of its rate window. Bounded per call.
if limits_on then
  claim_limited = function()
    local budget = want * 4 + 16
    while n < want and not broken and budget > 0 do
      budget = budget - 1
      local r = redis.pcall('ZRANGE', fk.limits_ready, 0, 0, 'WITHSCORES')
      if r.err then
        broken = fk.limits_ready .. ' is not a sorted set'
        return
      end
      if #r == 0 then
        -- Nothing parked: with no limit left either, claims skip all this.
        if redis.call('EXISTS', fk.limits) == 0 then
          redis.call('HDEL', KEYS[7], 'limits')
          limits_on = false
        end
        return
      end
      local entity, score = r[1], tonumber(r[2])
      if score > now then
        if score < lim.HELD and (nxt == 0 or score < nxt) then nxt = score end
        return
      end
      local tab = string.find(entity, '\t', 1, true)
      local kind = string.sub(entity, 1, (tab or 1) - 1)
      local cfg = (tab and config_of(kind)) or lim.config(nil)
      local keyed = tab and tab < #entity and (cfg[4] > 0 or cfg[5] > 0)
      local ok, kp, ep = lim.check(fk.limits_state, cfg, kind, entity, keyed, now)
      if not ok then
        if kp == 'hold' then
          lim.hold(fk.limits_state, fk.limits_ready, entity, kind)
        else
          redis.call('ZADD', fk.limits_ready, str(kp), entity)
          -- Its key's own limit refused it while its kind had room: an entity
          -- waiting on the kind-wide cap may use that room.
          if ep then lim.wake_held(fk.limits_state, fk.limits_ready, kind, now_s) end
        end
      else
        local m = redis.call('ZRANGEBYLEX', fk.limits_parked, '[' .. entity .. '\t',
          '(' .. entity .. '\t\255', 'LIMIT', 0, 1)
        if #m == 0 then
          redis.call('ZREM', fk.limits_ready, entity)
          lim.wake_held(fk.limits_state, fk.limits_ready, kind, now_s) -- the room it had is someone else's
        else
          redis.call('ZREM', fk.limits_parked, m[1])
          local id = string.sub(m[1], #entity + 3)
          if take(id, nil) == 'claimed' then
            local slot = lim.take(fk.limits_state, cfg, kind, entity, keyed, kp, ep, now_s)
            if slot ~= '' then
              redis.call('HSET', job_keys(prefix, id), 'slot', slot)
            end
            redis.call('ZADD', fk.limits_ready, now_s, entity)
          end
        end
      end
    end
  end
end

if limits_on then claim_limited() end

-- One command per level: the first k members by rank (k = jobs still
-- wanted). A pending zset is scored by eligible_at, so they hold, in the same
-- order, every member `ZRANGEBYSCORE -inf now LIMIT 0 k` would return; the
-- first one eligible later is the level's earliest remaining score (for
-- `next`), and nothing after it is eligible either.
-- A level is read again while its k members were all eligible but some were
-- dropped, cancelled, quarantined or parked rather than claimed (every one of
-- them left the set, so the next read sees members not seen yet): a job that
-- cannot be claimed never costs an eligible one its place. A level is done
-- when it runs out, when a member is not eligible yet (its score is the
-- level's `next`), or when the claim is full. At most PARK_MAX jobs are
-- parked per call (the rest on the next): one call stays short.
local PARK_MAX = 1000
local parked = 0
for level = 1, 4 do
  local again = true
  while again and n < want and not broken and parked < PARK_MAX do
    again = false
    local k = want - n
    local z = redis.pcall('ZRANGE', KEYS[level], 0, k - 1, 'WITHSCORES')
    if z.err then
      broken = KEYS[level] .. ' is not a sorted set'
      break
    end
    local later = false
    for i = 1, #z, 2 do
      local id, score = z[i], tonumber(z[i + 1])
      if score > now then
        if nxt == 0 or score < nxt then nxt = score end
        later = true
        break
      end
      local got = take(id, KEYS[level])
      if broken then break end
      if got == 'parked' then parked = parked + 1 end
    end
    again = not later and not broken and #z == 2 * k
  end
  if broken then break end
end
if parked >= PARK_MAX then
  nxt = now -- more to park: the next claim goes on at once
end
if parked > 0 and n < want and not broken then claim_limited() end

if broken then
  if n == 0 then
    return redis.error_reply('VR_WRONGTYPE ' .. broken)
  end
  return out -- the jobs claimed before the broken key; the next claim reports it
end
if n < want then
  -- Every level was read to its end, or to its first member not eligible
  -- yet, whose score is in nxt.
  out[2] = nxt
  redis.call('DEL', KEYS[8])
end
return out
