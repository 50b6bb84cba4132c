-- claim: move up to `count` eligible jobs from pending to running, highest
-- priority first; within a level, earliest eligibility first, ties in id
-- (ULID, so creation) order.
--
-- KEYS[1..4] pending zsets, CRITICAL, HIGH, NORMAL, LOW
-- KEYS[5]    running zset (scored by lease expiry)
-- KEYS[6]    dedup index hash (a throttled job's claim keeps its entry and
--            adds its field to `dedup:held`, keys.lua dedup_held_key; the
--            claim's cancel, expiry and quarantine endings free both at once)
-- KEYS[7]    queue meta hash (fields `paused`, `events`, `limits`; `history`
--            on a job's expiry only: include history.lua)
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
-- KEYS[11]   the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- KEYS[12]   optional: the claiming worker's stop list. An idle worker sends
--            this claim pipelined behind `BLPOP wake stop`; to stop it, the
--            worker pushes two tokens onto its stop list: BLPOP takes one and
--            this claim, finding the other, deletes the list and claims nothing
-- ARGV[1]    now in ms, or ''
-- ARGV[2]    key prefix of the queue ("venturi:{q}:"); job keys derive from it
-- ARGV[3]    count
-- ARGV[4]    worker id (stored as lease_owner)
-- ARGV[5]    lease token base; the k-th job of the reply gets token base .. '.' .. k
-- ARGV[6]    default lease in ms (a job's own lease_ms wins)
-- The event stream (include events.lua) and flow control's limits hash,
-- limits:state hash, limits:parked and limits:ready zsets (include
-- limits.lua) are reached only while the meta hash's `events` / `limits`
-- field is on (limit.lua sets `limits`), their names derived from the prefix
-- then (keys.lua feature_keys): not in KEYS, which every call pays for.
--
-- Returns {now, next, job...}: `next` is the earliest eligible_at still
-- pending when fewer than `count` jobs were claimed (0 = none; -1 = the queue
-- is paused). Each job is CLAIMED_VALUES = 9 values (calls.py CLAIM_FIELDS
-- names them): id, kind, payload, run_count (this run's), priority,
-- created_at, eligible_at, extras (false for a job with none, else its
-- EXTRA_FIELDS, '' for each it lacks), history (false for a job with no
-- journal yet, else the journal before this claim, as XRANGE returns it).
-- A job's lease token is not returned: the k-th job's is ARGV[5] .. '.' .. k.
--
-- The claim writes no journal: the run's claim is in the job's hash while it
-- runs (lease_owner, claimed_at), and the entry that ends the run carries it
-- (journal.lua). Each claimed job is one HGETALL and one HSET; the pending sets
-- lose the claimed jobs by rank and the running set gains them in one command
-- each, per call.
--
-- Errors: VR_WRONGTYPE when a pending or the running set is not a sorted set.
-- Each job is read and checked before anything is written for it, so no job
-- is left half moved: the claim stops at the broken key, and returns the jobs
-- it claimed before it, or, when it claimed none, the error.

-- A job with an order key that the claim ends (cancel requested, expired,
-- quarantined) joins `order:ended` (keys.lua feature_keys): the reclaim's
-- next sweep lets its key's next job go (order.lua). Not here: order.lua's
-- closure would cost every claim, and a job put in a pending set while the
-- claim reads it could take a rank its ZREMRANGEBYRANK drops. A job waiting
-- on its key is in no pending set: the claim never reads it.

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
-- @include history.lua

local now = now_ms(ARGV[1])
local now_s = str(now)
local prefix = ARGV[2]
local want = tonumber(ARGV[3])
local worker = ARGV[4]
local token_base = ARGV[5]
local default_lease = tonumber(ARGV[6])
local default_expires_s = str(now + default_lease)

if KEYS[12] and redis.call('DEL', KEYS[12]) == 1 then
  return {now, 0}
end

local meta = redis.call('HMGET', KEYS[7], 'paused', 'events', 'limits')
if meta[1] == '1' then
  redis.call('DEL', KEYS[8])
  return {now, -1}
end
local limits_on = meta[3] == '1'
-- Flow control's keys and helpers (lim), made only when on.
local fk, lim = nil, nil
if limits_on then
  fk = feature_keys(prefix)
  lim = limits_lib()
end

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

-- The running set takes every claimed job in one ZADD at the end, after their
-- hashes are written: a running set of the wrong type must be known first.
if type(redis.pcall('ZCARD', KEYS[5])) == 'table' then
  return redis.error_reply('VR_WRONGTYPE ' .. KEYS[5] .. ' is not a sorted set')
end
events_open(KEYS[7], events_key(prefix), prefix, meta[2] or false)

local out = {now, 0}
local o = 2 -- out's length
local n = 0
local nxt = 0
local broken = nil -- a queue-wide key of the wrong type: the claim stops there
local running = {} -- lease expiry, id, ... for the ZADD at the end
local claimed_ids, claimed_kinds, claimed_runs = {}, {}, {} -- the `claimed` event's
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

-- The endings a claim makes instead of a run: a job whose own data is
-- corrupt (quarantined), one whose cancel was requested while it ran
-- (cancelled), one past its start deadline (dead, expired). Their helpers
-- (the journal's, quarantine, cancel, offload, graph, history) are made by
-- endings_lib(), at the first such job of a call (E): each function a script
-- defines at its top is a closure made on every call, and the usual claim
-- meets none (benchmarks/README.md, "Session 22": -12 closures a claim).
-- Each ending leaves a job the claim read but did not claim: the caller
-- takes it out of its pending set (`listed`) or has taken it off the parked
-- set (`listed` false: its hash's `parked` goes). `held`, `dedup`: a
-- throttled job's key and the job's dedup field (dedup.lua unhold, unindex).
local E = nil
local function endings_lib()
  -- @lib (scripts.py prune: the helpers only this needs are made here)

  -- Dead: its key is free (any dedup job's: a dead holder is no candidate),
  -- its dependents told (graph.lua), its order key let go by the reclaim.
  local function let_go(job_key, id, held, dedup)
    if held then unhold(KEYS[6], dedup_held_key(prefix), dedup, id) else unindex(KEYS[6], dedup, id) end
    graph_orphaned(prefix, job_key, id)
    if redis.call('HEXISTS', job_key, 'order_key') == 1 then
      redis.pcall('SADD', feature_keys(prefix).order_ended, id) -- the reclaim lets its key go
    end
  end

  -- Its data is corrupt (`why`): quarantined. `held` is false when the job
  -- key is no hash (nothing of it to let go).
  local function quarantined(job_key, journal_key, id, why, hash, held, dedup)
    quarantine(job_key, journal_key, KEYS[10], id, now_s, why)
    if hash then let_go(job_key, id, held, dedup) end
  end

  -- An operator cancelled it while it ran, and that run ended (failed,
  -- paused, released, reclaimed) before its worker noticed: the cancel is
  -- finished here instead of running it again. A throttled job's key goes
  -- free with the look its last run left in dedup:held (dedup.lua unhold):
  -- a cancel opens no window.
  local function cancelled(job_key, journal_key, id, listed, held, dedup, run_count, pre)
    if not listed then redis.call('HDEL', job_key, 'parked') end
    materialize(job_key, journal_key, pre)
    finish_cancelled(prefix, job_key, journal_key, KEYS[9], id, now_s, run_count,
      'cancel requested while running', 'pending')
    let_go(job_key, id, held, dedup)
  end

  -- Not started before its deadline (enqueue(expires=...)): dead, never
  -- run; its `expiring` index entry leaves with the reclaim's next sweep.
  local function expired(job_key, journal_key, id, listed, held, dedup, run_count, pre, failures, expires, kind)
    if not listed then redis.call('HDEL', job_key, 'parked') end
    materialize(job_key, journal_key, pre)
    if failures then redis.call('ZREM', retrying_key(prefix), id) end
    local note = 'expired: not started before its deadline'
    redis.call('HSET', job_key, 'state', 'dead', 'note', note, 'dead_reason', 'expired',
      'finished_at', now_s, 'updated_at', now_s)
    redis.call('HDEL', job_key, 'eligible_at')
    redis.call('ZADD', KEYS[10], now_s, id)
    journal(journal_key, now_s, 'dead', run_count or 0, note, nil, {'reason', 'expired', 'expires_at', expires})
    compact_journal(journal_key)
    offload_settle(prefix, job_key, id, 'failed', nil, note, now_s)
    let_go(job_key, id, held, dedup)
    -- The metrics history's switch is read on this rare path only, not by
    -- every claim (include history.lua): the death counted, by kind.
    history_counts = redis.call('HGET', KEYS[7], 'history') == '1' and {} or nil
    if history_counts then
      history_counts[kind .. '\tdead'] = 1
      history_flush(prefix, now)
    end
  end

  return {quarantined = quarantined, cancelled = cancelled, expired = expired, journal_ok = journal_ok,
    bad_priority = bad_priority}
end

-- Claim the pending job `id`, found in a pending set (`listed`: the caller
-- takes it out of the set, claimed or not) or parked (`listed` false: the
-- caller took it off the parked set). Everything its claim depends on is
-- read and checked first. Returns 'claimed', 'parked' (a limited kind: parked
-- instead), or 'dropped' (dropped, cancelled or quarantined).
local function take(id, listed)
  local job_key, journal_key = job_keys(prefix, id)
  -- The whole hash in one read: a pending job holds few fields, and HMGET of
  -- the ones it may hold would scan it once per field it does not.
  local h = redis.pcall('HGETALL', job_key)
  local bad = nil
  local state, kind, payload, priority, run_count, created, eligible, dedup, cancel
  local lease_ms, carry, failures, maxf, resume, timeout_ms, expires
  local hooks = false -- an offload or dependents to see to at the run's end (lease.lua)
  local held = false -- a dedup window: the key stays held through the run (docs/dedup.md)
  local expired = false
  if h.err then
    bad = 'job key is not a hash'
  else
    for i = 1, #h, 2 do
      local k, v = h[i], h[i + 1]
      if k == 'state' then state = v
      elseif k == 'kind' then kind = v
      elseif k == 'payload' then payload = v
      elseif k == 'priority' then priority = v
      elseif k == 'eligible_at' then eligible = v
      elseif k == 'created_at' then created = v
      elseif k == 'run_count' then run_count = v
      elseif k == 'dedup' then dedup = v
      elseif k == 'failures' then failures = v
      elseif k == 'carry' then carry = v
      elseif k == 'lease_ms' then lease_ms = v
      elseif k == 'max_failures' then maxf = v
      elseif k == 'resume_input' then resume = v
      elseif k == 'timeout_ms' then timeout_ms = v
      elseif k == 'cancel_requested' then cancel = v
      elseif k == 'expires_at' then expires = v
      elseif k == 'offload' or k == 'dependents' then hooks = true
      elseif k == 'dedup_window' then hooks, held = true, true -- throttled: complete.lua holds the key on
      end
    end
    if not state then
      -- No state: corrupt while any other field is left (gone when none is).
      if #h > 0 then bad = 'state field is missing' end
    elseif state ~= 'pending' then
      bad = 'state is ' .. state .. ' while in a pending set'
    elseif not kind then
      bad = 'kind field is missing'
    elseif not PRIORITY_LEVEL[priority or ''] then
      E = E or endings_lib() -- a quarantine: the lib is made for it anyway
      bad = E.bad_priority(priority)
    elseif expires and not is_time(expires) then
      bad = 'expires_at field is not a time in ms'
    elseif expires and tonumber(expires) <= now then
      expired = true -- past its start deadline: never runs (below)
    elseif listed and limits_on and config_of(kind) then
      -- A limited kind: parked, to be claimed through the rotation.
      local key = redis.call('HGET', job_key, 'limit_key')
      lim.park(fk.limits_parked, fk.limits_ready, job_key, lim.entity(kind, key), priority, id, now_s)
      return 'parked'
    elseif not is_time(created) then
      bad = 'created_at field is not a time in ms'
    end
  end
  local history = false
  if expired and not run_count then
    E = E or endings_lib()
    if not E.journal_ok(journal_key) then
      bad = 'journal key is not a stream' -- its `dead` entry could not be written
    end
  end
  if not bad and run_count then
    -- The journal before this claim: a job has one once its hash has
    -- run_count (journal.lua materialize); most first claims have none.
    local j = redis.pcall('XRANGE', journal_key, '-', '+')
    if j.err then
      bad = 'journal key is not a stream'
    elseif #j > 0 then
      history = j
    end
  end
  if bad then
    E = E or endings_lib()
    E.quarantined(job_key, journal_key, id, bad, not h.err, held, dedup)
    return 'dropped'
  elseif not state then
    return 'dropped' -- a pending id whose hash is gone (removed by hand)
  elseif cancel then
    E = E or endings_lib()
    E.cancelled(job_key, journal_key, id, listed, held, dedup, run_count, {created, priority, eligible})
    return 'dropped'
  elseif expired then
    E = E or endings_lib()
    E.expired(job_key, journal_key, id, listed, held, dedup, run_count, {created, priority, eligible},
      failures, expires, kind)
    return 'dropped'
  end
  -- The lease's end and the run's number, formatted per job only when the
  -- job has its own lease or an earlier run (a format costs ~1,300
  -- instructions: two per job were 2% of a drain).
  local expires_s = default_expires_s
  if lease_ms then expires_s = str(now + (tonumber(lease_ms) or default_lease)) end
  n = n + 1
  local run = run_count and str((tonumber(run_count) or 0) + 1) or '1'
  if hooks then
    redis.call('HSET', job_key, 'state', 'running', 'run_count', run,
      'lease_owner', worker, 'lease_token', token_base .. '.' .. str(n), 'lease_expires', expires_s,
      'claimed_at', now_s, 'hooks', '1')
  else
    redis.call('HSET', job_key, 'state', 'running', 'run_count', run,
      'lease_owner', worker, 'lease_token', token_base .. '.' .. str(n), 'lease_expires', expires_s,
      'claimed_at', now_s)
  end
  if not listed then redis.call('HDEL', job_key, 'parked') end
  if held then
    -- Throttled: the index keeps pointing at the job while it runs (an enqueue
    -- of its key returns its id, _producer/dedup.py); the reclaim's sweep
    -- looks at the field again at the lease's expiry (keys.lua dedup_held_key).
    -- Only for the key's holder: a job that runs as its own row (another took
    -- the key while it was out of pending) must not move the holder's look,
    -- which may be a completed window's end that outlives its trimmed job.
    if dedup and redis.pcall('HGET', KEYS[6], dedup) == id then
      redis.pcall('ZADD', dedup_held_key(prefix), expires_s, dedup)
    end
  elseif dedup then
    unindex(KEYS[6], dedup, id)
  end
  -- A retried job leaves the retrying index (retry.lua, reclaim.lua) as it runs again.
  if failures then redis.call('ZREM', retrying_key(prefix), id) end
  running[2 * n - 1] = expires_s
  running[2 * n] = id
  if events_stream then
    claimed_ids[n], claimed_kinds[n], claimed_runs[n] = id, kind, run
  end
  local extras = false
  if lease_ms or carry or failures or maxf or resume or timeout_ms then
    extras = {lease_ms or '', carry or '', failures or '', maxf or '', resume or '', timeout_ms or ''}
  end
  out[o + 1] = id
  out[o + 2] = kind
  out[o + 3] = payload or ''
  out[o + 4] = run
  out[o + 5] = priority
  out[o + 6] = created
  out[o + 7] = eligible or ''
  out[o + 8] = extras
  out[o + 9] = history
  o = o + 9
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
          -- Its rate ring goes once its window closes (limits.lua rest).
          if keyed and cfg[5] > 0 then lim.rest(fk.limits_state, fk.limits_rings, entity, cfg[5], cfg[6], now) end
          lim.wake_held(fk.limits_state, fk.limits_ready, kind, now_s) -- the room it had is someone else's
        else
          redis.call('ZREM', fk.limits_parked, m[1])
          local id = string.sub(m[1], #entity + 3)
          if take(id, false) == 'claimed' then
            local slot = lim.take(fk.limits_state, cfg, kind, entity, keyed, kp, ep, now_s)
            if slot ~= '' then
              redis.call('HSET', job_keys(prefix, id), 'slot', slot, 'hooks', '1')
            end
            redis.call('ZADD', fk.limits_ready, now_s, entity)
          end
        end
      end
    end
  end
end

if limits_on then claim_limited() end

-- Each level is read from its head: its first member and score (one
-- command), so a level that is empty (Redis deletes an empty set) or whose
-- head is eligible later (that score is the level's `next`) costs one read,
-- not two. A head eligible now is the claim's when one job is wanted;
-- otherwise the first k members by rank (k = jobs still wanted) are read. A
-- pending zset is scored by eligible_at, so they hold, in the same order,
-- every member `ZRANGEBYSCORE -inf now LIMIT 0 k` would return. The members
-- taken (the first `taken` by rank: claimed, dropped, cancelled, quarantined
-- or parked) leave the set in one ZREMRANGEBYRANK.
-- A level is read again (from its head) while its k members were all
-- eligible, some maybe not claimed (each left the set, so the next read sees
-- members not seen yet): a job that cannot be claimed never costs an
-- eligible one its place. A level is done when it runs out, when its head is
-- not eligible yet, or when the claim is full. At most PARK_MAX jobs are
-- parked per call (the rest on the next): one call stays short.
local PARK_MAX = 1000
local parked = 0
for level = 1, 4 do
  while n < want and not broken and parked < PARK_MAX do
    local head = redis.pcall('ZRANGE', KEYS[level], 0, 0, 'WITHSCORES')
    if head.err then
      broken = KEYS[level] .. ' is not a sorted set'
      break
    end
    if not head[2] then break end -- empty
    local score = tonumber(head[2])
    if score > now then
      if nxt == 0 or score < nxt then nxt = score end
      break
    end
    local k = want - n
    -- The due ids alone (no scores: a score is a double formatted for the
    -- reply and parsed back, per job).
    local z = k == 1 and {head[1]}
      or redis.call('ZRANGE', KEYS[level], '-inf', now, 'BYSCORE', 'LIMIT', 0, k)
    for i = 1, #z do
      if take(z[i], true) == 'parked' then parked = parked + 1 end
    end
    redis.call('ZREMRANGEBYRANK', KEYS[level], 0, #z - 1)
  end
  if broken then break end
end
if parked >= PARK_MAX then
  nxt = now -- more to park: the next claim goes on at once
end
if parked > 0 and n < want and not broken then claim_limited() end

if n > 0 then
  -- unpack takes at most a few thousand values: the running set in chunks.
  for i = 1, 2 * n, 1000 do
    redis.call('ZADD', KEYS[5], unpack(running, i, math.min(i + 999, 2 * n)))
  end
  if events_stream then
    emit_many('claimed', now_s, claimed_ids, claimed_kinds, claimed_runs, {'worker', worker})
  end
end
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
