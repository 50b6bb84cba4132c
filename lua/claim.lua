-- claim: move up to `count` eligible jobs from pending to running, highest
-- priority first; within a level, earliest eligibility first, ties in id
-- (ULID, so creation) order.
--
-- KEYS[1..4] pending zsets, CRITICAL, HIGH, NORMAL, LOW
-- KEYS[5]    running zset (scored by lease expiry)
-- KEYS[6]    dedup index hash
-- KEYS[7]    queue meta hash (fields `paused`, `events`)
-- KEYS[8]    wake list (wake.lua wake_workers): deleted when the claim
--            comes back short or the queue is paused, since every token in it
--            is stale then (whatever enqueue pushed it for is claimed, or not
--            eligible yet, and this claim's `next` covers that)
-- KEYS[9]    cancelled zset: a pending job whose cancel was requested while
--            it ran (cancel.lua) is cancelled here instead of claimed
-- KEYS[10]   dead zset: a pending job whose own data is corrupt is
--            quarantined there (quarantine.lua) instead of claimed
--            (either way the jobs waiting on it apply their policy: graph.lua,
--            whose queue-wide keys derive from the prefix, keys.lua)
-- KEYS[11]   event stream (include events.lua)
-- KEYS[12]   optional: the claiming worker's stop list. An idle worker sends
--            this claim pipelined behind `BLPOP wake stop`; to stop it, the
--            worker pushes two tokens onto its stop list: BLPOP takes one and
--            this claim, finding the other, deletes the list and claims nothing
-- ARGV[1]    now in ms, or ''
-- ARGV[2]    key prefix of the queue ("venturi:{q}:"); job keys derive from it
-- ARGV[3]    count
-- ARGV[4]    worker id (stored as lease_owner, journaled)
-- ARGV[5]    lease token base; job k of this batch gets token base .. '.' .. k
-- ARGV[6]    default lease in ms (a job's own lease_ms wins)
--
-- Returns {now, next, job...}: `next` is the earliest eligible_at still
-- pending when fewer than `count` jobs were claimed (0 = none; -1 = the queue
-- is paused). Each job is 12 values: id, kind, payload, carry, run_count,
-- failures, token, lease_ms, priority, max_failures, resume_input, history
-- (the journal before this claim, as XRANGE returns it; for a first claim,
-- whose journal is only the `enqueued` entry it has just written, that
-- entry's values instead: {created_at, priority, eligible_at}, which the
-- client turns into the same entry, _records.py claim_history).
--
-- Errors: VR_WRONGTYPE when a pending or the running set is not a sorted set.
-- Each job is read and checked before anything is written for it, so no job
-- is left half moved: the claim stops at the broken key, and returns the jobs
-- it claimed before it, or, when it claimed none, the error.

-- @include clock.lua
-- @include keys.lua
-- @include journal.lua
-- @include dedup.lua
-- @include finish.lua
-- @include quarantine.lua
-- @include graph.lua

local now = now_ms(ARGV[1])
local now_s = str(now)
local prefix = ARGV[2]
local want = tonumber(ARGV[3])
local worker = ARGV[4]
local default_lease = tonumber(ARGV[6])

if KEYS[12] and redis.call('DEL', KEYS[12]) == 1 then
  return {now, 0}
end

local meta = redis.call('HMGET', KEYS[7], 'paused', 'events')
if meta[1] == '1' then
  redis.call('DEL', KEYS[8])
  return {now, -1}
end

events_open(KEYS[7], KEYS[11], prefix, meta[2] or false)

-- An idle queue (every pending set empty; Redis deletes an empty set) is
-- answered with one EXISTS instead of a ZRANGE per level.
if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4]) == 0 then
  redis.call('DEL', KEYS[8])
  return {now, 0}
end

-- One command per level: the first k members by rank (k = jobs still
-- wanted). A pending zset is scored by eligible_at, so they hold, in the same
-- order, every member `ZRANGEBYSCORE -inf now LIMIT 0 k` would return; the
-- first one eligible later is the level's earliest remaining score (for
-- `next`), and nothing after it is eligible either.
local out = {now, 0}
local n = 0
local nxt = 0
local broken = nil -- a queue-wide key of the wrong type: the claim stops there
-- A level is read again while its k members were all eligible but some were
-- dropped, cancelled or quarantined rather than claimed (every one of them
-- left the set, so the next read sees members not seen yet): a job that
-- cannot be claimed never costs an eligible one its place. A level is done
-- when it runs out, when a member is not eligible yet (its score is the
-- level's `next`), or when the claim is full.
for level = 1, 4 do
  local again = true
  while again and n < want and not broken do
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
      local job_key, journal_key = job_keys(prefix, id)
      -- Everything this job's claim depends on is read and checked first.
      local f = redis.pcall('HMGET', job_key, 'kind', 'payload', 'carry', 'run_count',
        'failures', 'lease_ms', 'priority', 'max_failures', 'resume_input', 'dedup', 'state',
        'cancel_requested', 'created_at', 'eligible_at')
      local bad = nil
      local first, history = false, nil
      if f.err then
        bad = 'job key is not a hash'
      elseif not f[11] then
        if f[1] or f[13] then bad = 'state field is missing' end
      elseif f[11] ~= 'pending' then
        bad = 'state is ' .. f[11] .. ' while in a pending set'
      elseif not f[1] then
        bad = 'kind field is missing'
      elseif not PRIORITY_LEVEL[f[7] or ''] then
        bad = bad_priority(f[7])
      elseif redis.call('EXISTS', journal_key) == 0 then
        -- Claimed (or cancelled) for the first time: the `enqueued` entry
        -- enqueue did not write goes first, from created_at, which must be a time.
        if is_time(f[13]) then first = true else bad = 'created_at field is not a time in ms' end
      elseif not f[12] then
        history = redis.pcall('XRANGE', journal_key, '-', '+')
        if history.err then bad = 'journal key is not a stream' end
      end
      if bad then
        redis.call('ZREM', KEYS[level], id)
        quarantine(job_key, journal_key, KEYS[10], id, now_s, bad)
        -- Dead: the jobs waiting on it apply their policy (graph.lua; rare,
        -- so the flag is read here, not on the claim path).
        if not f.err then
          graph_finished(prefix, redis.call('HGET', job_key, 'dependents'), job_key, id, now,
            false, nil, bad)
        end
      elseif not f[11] then
        -- A pending id whose hash is gone (removed by hand) is dropped.
        redis.call('ZREM', KEYS[level], id)
      elseif f[12] then
        -- An operator cancelled it while it ran, and that run ended (failed,
        -- paused, released, reclaimed) before its worker noticed: finish the
        -- cancel here instead of running it again.
        redis.call('ZREM', KEYS[level], id)
        if first then write_enqueued(journal_key, {f[13], f[7], f[14]}) end
        unindex(KEYS[6], f[10], id)
        finish_cancelled(prefix, job_key, journal_key, KEYS[9], id, now_s, f[4],
          'cancel requested while running', 'pending')
        graph_finished(prefix, redis.call('HGET', job_key, 'dependents'), job_key, id, now,
          false, nil, 'cancelled: cancel requested while running')
      else
        local lease = tonumber(f[6]) or default_lease
        local expires_s = str(now + lease)
        -- The running set first: a wrong-type one fails here, before any
        -- write for this job, and the claim stops with what it has.
        local added = redis.pcall('ZADD', KEYS[5], expires_s, id)
        if type(added) == 'table' and added.err then
          broken = KEYS[5] .. ' is not a sorted set'
          break
        end
        redis.call('ZREM', KEYS[level], id)
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
      end
    end
    again = not later and not broken and #z == 2 * k
  end
  if broken then break end
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
