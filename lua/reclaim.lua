-- reclaim: take back jobs whose lease expired (their worker died, hung or
-- lost its connection). Each reclaim counts as a failed run, so a job that
-- kills its worker every time reaches the retry backstop and goes to dead.
-- The job's lease token is cleared, which fences the old worker out.
--
-- KEYS[1] running zset   KEYS[2] dead zset   KEYS[3] dedup index hash
-- KEYS[4] wake list
-- KEYS[5..8] pending zsets, CRITICAL first: the job's priority field picks one
-- KEYS[9] queue meta hash (its `history` field: include history.lua, each
--         lease expired a failed run, each death by the backstop or a start
--         deadline a dead job, by kind)
-- KEYS[10] event stream (include events.lua)
-- KEYS[11] limits:state hash   KEYS[12] limits:ready zset: a run holding a
--         concurrency slot gives it back (include limits.lua)
-- When the backstop kills a job others wait on, they apply their policy
-- (graph.lua; its queue-wide keys derive from the prefix, keys.lua).
-- KEYS[13] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''
-- ARGV[2] key prefix of the queue (job hashes and journals derive from it)
-- ARGV[3] at most this many jobs per call
-- ARGV[4] default max_failures ('none' = off)
--
-- A throttled job that dies here (its `dedup_window`) frees its dedup key
-- at once, the index entry and its `dedup:held` field (dedup.lua unhold):
-- only a completion opens a window (docs/dedup.md).
-- A job that dies here and is an offload gets its `failed` snapshot and the
-- redacted wake-up (include offload.lua), its error 'lease expired ...'.
-- A job whose own data is corrupt (a job key that is not a hash, a priority
-- that names no pending set, a journal key that is not a stream) is
-- quarantined (quarantine.lua), counted dead; the other jobs of the sweep go
-- on as usual.
-- Then the jobs past their start deadline (the `expiring` index, keys.lua
-- feature_keys; at most EXPIRE_MAX a call, the rest on the next sweep): a
-- pending (listed or parked) or waiting one goes dead, reason `expired`,
-- never run; a running one (started before its deadline) is looked at again
-- when its lease would end, since a failed run leaves it pending; a finished
-- or missing one leaves the index. A claim that reaches an expired job first
-- ends it the same way (claim.lua).
-- A job with an order key that dies here (backstop, quarantine, expiry)
-- releases its key, or leaves its key's queue (order.lua); one requeued
-- keeps it. Then the ordered jobs the claim ended (`order:ended`) release
-- theirs.
-- Then the finished jobs of the `graph:orphans` set (keys.lua; the claim's
-- cancel and quarantine endings add to it) tell their dependents.
--
-- Then the throttled dedup keys due a look (keys.lua dedup_held_key) are
-- kept or freed, up to 100 a call; and the per-key rate windows whose key
-- left the rotation while they were open (`limits:rings`, keys.lua
-- feature_keys) go once closed, up to 100 a call (limits.lua sweep_rings).
--
-- Returns {requeued, dead, more, id...}: `more` is 1 when a part other than
-- the expired leases (start deadlines, orphans, throttled keys, ended order
-- keys) stopped at its cap with more maybe left, so that the worker calls
-- again on the same tick (runner.py reclaim_once): a fixed amount a tick
-- fell behind whatever came faster (100 throttled keys a 15 s tick, while a
-- worker completes thousands of jobs a second), and those keys stayed in
-- Redis for good.

-- @include clock.lua
-- @include keys.lua
-- @include lease.lua
-- @include dedup.lua
-- @include wake.lua
-- @include offload.lua
-- @include quarantine.lua
-- @include graph.lua
-- @include limits.lua
-- @include history.lua
-- @include order.lua

local prefix = ARGV[2]
local now = now_ms(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
-- The events switch is read only when there is something to journal: an
-- idle worker's sweep (every reclaim interval) runs no more commands for it.
local events_read = #ids > 0
if events_read then
  events_open(KEYS[9], KEYS[10], ARGV[2])
  history_counts = redis.call('HGET', KEYS[9], 'history') == '1' and {} or nil
end
local requeued, died = 0, 0
local requeued_slots = false
local out = {0, 0, 0}
-- A capped part found a full batch: call again (the header's `more`).
local more = false
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local job_key, journal_key = job_keys(prefix, id)
  local f = redis.pcall('HMGET', job_key, 'state', 'failures', 'max_failures',
    'priority', 'run_count', 'lease_owner', 'lease_expires', 'dependents', 'slot', 'claimed_at',
    'cancel_requested', 'dedup_window', 'dedup', 'kind', 'order_key')
  local pending = nil
  if f.err then
    quarantine(job_key, journal_key, KEYS[2], id, now, 'job key is not a hash')
    died = died + 1
    out[#out + 1] = id
  elseif f[1] == 'running' then
    if f[9] and limits_lib().release(KEYS[11], KEYS[12], job_key, f[9], str(now)) then
      requeued_slots = true
    end
    pending = pending_key(5, f[4])
    local failures = (tonumber(f[2]) or 0) + 1
    local limit = backstop(f[3], ARGV[4])
    local bad = nil
    if not pending then
      bad = bad_priority(f[4])
    elseif not journal_ok(journal_key) then
      bad = 'journal key is not a stream'
    end
    -- A throttled job that dies here frees its key at once (dedup.lua unhold).
    local held = f[12] and f[13]
    if bad then
      quarantine(job_key, journal_key, KEYS[2], id, now, bad)
      if held then unhold(KEYS[3], dedup_held_key(prefix), f[13], id) end
      graph_finished(prefix, f[8], job_key, id, now, false, nil, bad)
      if f[15] then
        order_lib(feature_keys, graph_queue_keys, job_keys).release(prefix, job_key, f[15], id, nil)
      end
      died = died + 1
    else
      materialize(job_key, journal_key) -- a first run's claim wrote no journal
      clear_lease(job_key)
      local extra = {'lease_expires', f[7] or '', 'failures', failures}
      if f[10] then
        with_claim(extra, f[6], f[10])
      else -- claimed by a release before 0.2: its `claimed` entry is there
        extra[#extra + 1] = 'worker'
        extra[#extra + 1] = f[6] or ''
      end
      journal(journal_key, now, 'lease_expired', f[5], 'lease expired; worker presumed dead', nil, extra)
      if history_counts then history_count(f[14] or '', 'failed', 1) end
      if limit and failures >= limit then
        local runs = failures .. (failures == 1 and ' failed run' or ' failed runs')
        redis.call('HSET', job_key, 'state', 'dead', 'failures', failures,
          'note', 'lease expired', 'dead_reason', 'max_failures', 'finished_at', now, 'updated_at', now)
        redis.call('ZADD', KEYS[2], now, id)
        if held then unhold(KEYS[3], dedup_held_key(prefix), f[13], id) end
        journal(journal_key, now, 'dead', f[5],
          'retry backstop: ' .. runs .. ' (max_failures=' .. limit .. ')', nil,
          {'reason', 'max_failures'})
        offload_settle(prefix, job_key, id, 'failed', nil,
          'lease expired; retry backstop: ' .. runs, now)
        if f[8] then
          graph_finished(prefix, f[8], job_key, id, now, false, nil,
            'lease expired; retry backstop: ' .. runs)
        end
        if history_counts then history_count(f[14] or '', 'dead', 1) end
        if f[15] then
          order_lib(feature_keys, graph_queue_keys, job_keys).release(prefix, job_key, f[15], id, nil)
        end
        died = died + 1
      else
        redis.call('HSET', job_key, 'state', 'pending', 'failures', failures,
          'note', 'lease expired', 'eligible_at', now, 'updated_at', now)
        back_to_pending(pending, KEYS[3], job_key, id, now)
        -- A failed run: the job waits for its retry in the `retrying` index
        -- (keys.lua), unless the claim is to cancel it (cancel requested).
        if not f[11] then redis.call('ZADD', retrying_key(prefix), now, id) end
        requeued = requeued + 1
      end
      compact_journal(journal_key)
    end
    out[#out + 1] = id
  end
end
-- Past their start deadline (enqueue(expires=...)): see the header.
local held_key = dedup_held_key(prefix)
local EXPIRE_MAX = 1000
-- The queue's feature keys, made once for the sweeps below.
local fk = feature_keys(prefix)
local exp_key = fk.expiring
local due = redis.call('ZRANGE', exp_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, EXPIRE_MAX)
more = more or #due == EXPIRE_MAX
if #due > 0 and not events_read then
  events_open(KEYS[9], KEYS[10], ARGV[2])
  history_counts = redis.call('HGET', KEYS[9], 'history') == '1' and {} or nil
  events_read = true
end
for _, eid in ipairs(due) do
  local job_key, journal_key = job_keys(prefix, eid)
  local f = redis.pcall('HMGET', job_key, 'state', 'expires_at', 'priority', 'dedup', 'parked',
    'failures', 'dependents', 'lease_expires', 'run_count', 'dedup_window', 'kind', 'order_key', 'ordered')
  local state = not f.err and f[1]
  local deadline = not f.err and tonumber(f[2])
  if (state == 'pending' or state == 'waiting') and deadline and deadline <= now then
    local pending = state == 'pending' and pending_key(5, f[3])
    local bad = nil
    if state == 'pending' and not pending then
      bad = bad_priority(f[3])
    elseif not journal_ok(journal_key) then
      bad = 'journal key is not a stream'
    end
    if bad then
      if pending then redis.call('ZREM', pending, eid) end
      quarantine(job_key, journal_key, KEYS[2], eid, now, bad)
      graph_finished(prefix, f[7], job_key, eid, now, false, nil, bad)
    else
      if pending then
        redis.call('ZREM', pending, eid)
        if f[5] then
          limits_lib().unpark(fk.limits_parked, f[5])
          redis.call('HDEL', job_key, 'parked')
        end
        if f[10] then unhold(KEYS[3], held_key, f[4], eid) else unindex(KEYS[3], f[4], eid) end
        if f[6] then redis.call('ZREM', retrying_key(prefix), eid) end
      else
        redis.call('ZREM', graph_queue_keys(prefix).waiting, eid)
        graph_detach(prefix, eid)
      end
      materialize(job_key, journal_key)
      local note = 'expired: not started before its deadline'
      redis.call('HSET', job_key, 'state', 'dead', 'note', note, 'dead_reason', 'expired',
        'finished_at', now, 'updated_at', now)
      redis.call('HDEL', job_key, 'eligible_at')
      redis.call('ZADD', KEYS[2], now, eid)
      journal(journal_key, now, 'dead', f[9] or 0, note, nil, {'reason', 'expired', 'expires_at', f[2]})
      compact_journal(journal_key)
      offload_settle(prefix, job_key, eid, 'failed', nil, note, now)
      graph_finished(prefix, f[7], job_key, eid, now, false, nil, note)
      if history_counts then history_count(f[11] or '', 'dead', 1) end
    end
    -- Dead either way: waiting on its key, it leaves the key's queue; holding
    -- it, it lets the next go.
    if f[12] then
      order_lib(feature_keys, graph_queue_keys, job_keys).release(prefix, job_key, f[12], eid, f[13] or nil)
    end
    redis.call('ZREM', exp_key, eid)
  elseif state == 'running' then
    -- Its run may fail and leave it pending: looked at again when its lease
    -- would end (an expired lease is taken back by the sweep above).
    redis.call('ZADD', exp_key, str(math.max(tonumber(f[8]) or 0, now + 1)), eid)
  elseif (state == 'pending' or state == 'waiting') and deadline then
    redis.call('ZADD', exp_key, f[2], eid) -- a later deadline than its entry said
  else
    redis.call('ZREM', exp_key, eid) -- finished, gone, or no deadline any more
  end
end

-- Jobs the claim ended (cancelled, quarantined) whose dependents are still
-- to be told (graph.lua graph_orphaned): told here, a batch a call. A job
-- back in another state since (an operator's retry) tells them when it ends.
local orphans = redis.call('SPOP', graph_orphans_key(prefix), 100)
more = more or #orphans == 100
if #orphans > 0 and not events_read then
  events_open(KEYS[9], KEYS[10], ARGV[2])
  history_counts = redis.call('HGET', KEYS[9], 'history') == '1' and {} or nil
end
for _, oid in ipairs(orphans) do
  local o_key = job_keys(prefix, oid)
  local s = redis.pcall('HMGET', o_key, 'state', 'note', 'result')
  if not s.err and (s[1] == 'cancelled' or s[1] == 'dead') then
    local why = s[2] or ''
    if s[1] == 'cancelled' then why = 'cancelled: ' .. why end
    graph_finished(prefix, '1', o_key, oid, now, false, nil, why)
  elseif not s.err and s[1] == 'completed' then
    -- A completion whose dependents could not be told then (graph.lua: a
    -- queue-wide key was damaged): told now, or kept for the next sweep.
    graph_finished(prefix, '1', o_key, oid, now, true, s[3] or '', nil)
  end
end
-- Throttled keys due a look (keys.lua dedup_held_key; docs/dedup.md): a key
-- whose job still holds it (running: until its lease's expiry; completed:
-- until its window's end) is looked at again then; any other is freed, if
-- the index still gives that job (its window over, dead, cancelled,
-- suspended, trimmed). A pending holder keeps the key: its claim adds it back.
local due = redis.pcall('ZRANGEBYSCORE', held_key, '-inf', now, 'LIMIT', 0, 100)
local index_type = #due > 0 and redis.call('TYPE', KEYS[3]).ok
-- No index at all (its last field freed) still lets the sweep drop the fields.
if type(due) == 'table' and not due.err and #due > 0 and (index_type == 'hash' or index_type == 'none') then
  -- Each field looked at leaves the due range (kept: scored later; else dropped).
  more = more or #due == 100
  for _, field in ipairs(due) do
    local holder = redis.call('HGET', KEYS[3], field)
    local again = nil
    if holder then
      local h = redis.pcall('HMGET', job_keys(prefix, holder), 'state', 'lease_expires', 'dedup_until')
      if h.err then
        h = {}
      end
      if h[1] == 'pending' then
        again = nil
      elseif h[1] == 'running' then
        -- Its lease, or soon when that has expired (a reclaim to come).
        again = (tonumber(h[2] or '') or 0) > now and h[2] or str(now + 1000)
      elseif h[1] == 'completed' and tonumber(h[3] or '') and tonumber(h[3]) > now then
        again = h[3]
      else
        redis.call('HDEL', KEYS[3], field)
      end
    end
    if again then
      redis.call('ZADD', held_key, again, field)
    else
      redis.call('ZREM', held_key, field)
    end
  end
end
if history_counts then history_flush(prefix, now) end
-- Ordered jobs the claim ended (cancel requested, expired, quarantined:
-- claim.lua adds them to `order:ended`, keys.lua feature_keys): their keys
-- let the next job go here (order.lua), a batch a call.
local ended = redis.pcall('SPOP', fk.order_ended, 100)
if type(ended) == 'table' and not ended.err and #ended > 0 then
  more = more or #ended == 100
  local ol = order_lib(feature_keys, graph_queue_keys, job_keys)
  for _, oid in ipairs(ended) do
    ol.ended(prefix, (job_keys(prefix, oid)), oid)
  end
end
-- The per-key rate rings whose window closed after their key's last
-- parked job (limits.lua sweep_rings; `limits:rings`, keys.lua feature_keys):
-- the lib is built only when there are some (most queues have no per-key rate).
local rings = fk.limits_rings
if redis.call('EXISTS', rings) == 1 and limits_lib().sweep_rings(KEYS[11], KEYS[12], rings, now) then
  more = true
end
out[1] = requeued
out[2] = died
out[3] = more and 1 or 0
if requeued > 0 or requeued_slots then
  wake_workers(KEYS[4], requeued + 1)
end
return out
