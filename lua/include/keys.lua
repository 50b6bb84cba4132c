-- The keys a script discovers as it runs: the jobs a claim pops, a reclaim
-- finds expired, a purge trims, an extend renews. They are built here, and
-- only here, from the queue's prefix (ARGV[2] of every script) and an id read
-- from one of the queue's own sets or given by the caller. Every other key
-- arrives in KEYS, and no key name is built from a value read out of a job's
-- hash: a `priority` field picks one of the pending sets passed in KEYS
-- (pending_key), it is never spliced into a name. (The one derived name is an
-- offload's snapshot, whose token is checked to be a token first: offload_key.)

local function job_keys(prefix, id)
  return prefix .. 'job:' .. id, prefix .. 'journal:' .. id
end

-- The queue's event stream (events.lua), for the scripts that reach it only
-- while events are on (claim.lua, complete.lua): one concatenation, not the
-- table of feature_keys.
local function events_key(prefix)
  return prefix .. 'events'
end

-- The scratch key journal.lua's compact_journal renames a journal to while it
-- copies it back at its exact size (empty between calls). Being absent
-- between calls makes it the slot guard too: every script but enqueue
-- declares it as a key (calls.py), so while a Redis Cluster moves the queue's
-- slot (MIGRATING here, IMPORTING there) one declared key is always missing
-- and Redis refuses the call (TRYAGAIN, ASK) before it runs. Without it, a
-- script could start here and then meet a job's hash or journal that had
-- already moved: an error part-way through, after its first writes (or, read
-- under pcall, a key taken for one of the wrong type). enqueue needs none:
-- the new job's hash it declares is missing here until the move ends.
local function journal_scratch_key(prefix)
  return prefix .. 'journal-compact'
end

-- Scripts that read a job's priority from its hash take the four pending sets
-- in KEYS, CRITICAL first, from index `first`. A priority field that names
-- none of them gives nil: the job's data is corrupt (see quarantine.lua).
local PRIORITY_LEVEL = {critical = 0, high = 1, normal = 2, low = 3}
local function pending_key(first, priority)
  local level = PRIORITY_LEVEL[priority or '']
  if level == nil then
    return nil
  end
  return KEYS[first + level]
end

-- What a corrupt priority field is told (a note of quarantine.lua's).
local function bad_priority(priority)
  if not priority then
    return 'priority field is missing'
  end
  return 'priority field ' .. string.format('%q', priority) ..
    ' is not one of critical, high, normal, low'
end

-- The snapshot of an offload job (offload.lua): its token, from the job's
-- `offload` field, must be a token (what venturi mints: 32 URL-safe base64
-- characters, at most 64 here), else there is no snapshot to settle.
local function offload_key(prefix, token)
  if not token or #token > 64 or not string.match(token, '^[%w_%-]+$') then
    return nil
  end
  return prefix .. 'offload:' .. token
end

-- A job's place in a workflow (graph.lua): the set of ids it still waits on,
-- the set of ids waiting on it, and the hash of its dependencies' results
-- (copied there as each one completes). Derived from the prefix and an id
-- given by the caller or read from one of these sets.
local function graph_keys(prefix, id)
  return prefix .. 'deps:' .. id, prefix .. 'dependents:' .. id, prefix .. 'depresults:' .. id
end

-- The set of finished jobs whose dependents are still to be told: the
-- claim's rare endings (a cancel requested while the job ran; a quarantine)
-- add to it rather than carry the graph's code on every claim, and so does a
-- completion that found a queue-wide key damaged; reclaim.lua tells their
-- dependents on its next sweep (graph.lua).
local function graph_orphans_key(prefix)
  return prefix .. 'graph:orphans'
end

-- The keys of the two features a queue may leave off, its event stream
-- (events.lua) and flow control (limits.lua), for claim.lua and complete.lua,
-- which reach them only while the feature is on (the meta hash's `events`
-- and `limits` fields, read anyway, say so) or for a run that holds a slot
-- (and the wake list, then, to tell a worker). Passed in KEYS they cost
-- every call ~1,600 Redis instructions a key (benchmarks/redis_cost.py:
-- +8,000 per job at batch 1 for complete's five) for features most queues
-- never turn on; derived here, a queue without them pays nothing.
local function feature_keys(prefix)
  return {
    events = prefix .. 'events', wake = prefix .. 'wake', limits = prefix .. 'limits',
    limits_state = prefix .. 'limits:state', limits_parked = prefix .. 'limits:parked',
    limits_ready = prefix .. 'limits:ready',
    -- The per-key rate rings whose key left the ready rotation while their
    -- window was open (`limits:rings`, zset, `<kind>\t<key field>\t#<count>`
    -- scored by when the window closes): the reclaim's sweep drops them then
    -- (limits.lua rest, sweep_rings).
    limits_rings = prefix .. 'limits:rings',
    -- The jobs with a start deadline (`expiring`, docs/redis-layout.md): id
    -- scored by expires_at (enqueue(expires=...)). job_args.lua adds a job
    -- as it is created; the reclaim sweep takes the ones past their deadline.
    expiring = prefix .. 'expiring',
    -- Ordered keys (order.lua, docs/semantics.md "Ordered keys"), reached
    -- only for a job with an order key (its `order_key` field, its `hooks`
    -- flag): `order:held`, hash, order key -> the id of the job holding it;
    -- `order:queue`, zset, every score 0, the jobs waiting on their key,
    -- lex-ordered as order key, byte 255 (never in UTF-8), a 16-digit
    -- sequence number, id; `order:paused`, set, the keys an operator
    -- paused; `order:seq`, string, the sequence's counter.
    -- `order:ended`, set, ids of ordered jobs the claim ended (cancel
    -- requested, expired, quarantined) whose keys the reclaim lets go.
    order_held = prefix .. 'order:held', order_queue = prefix .. 'order:queue',
    order_paused = prefix .. 'order:paused', order_seq = prefix .. 'order:seq',
    order_ended = prefix .. 'order:ended',
  }
end

-- The index of the pending jobs whose last run failed, waiting for their
-- retry (`retrying`, docs/redis-layout.md): what `queue.counts()["retrying"]`
-- counts with one ZCARD. retry.lua and reclaim.lua add a job (scored by when
-- it is due again); the claim of a job with failures, a cancel, an operator's
-- retry and a purge remove it. Derived here, not passed in KEYS: the claim
-- reaches it only for a job that has failed (a key in KEYS costs every claim
-- ~1,600 Redis instructions, keys.lua feature_keys), and every script that
-- touches it then names it the same way.
local function retrying_key(prefix)
  return prefix .. 'retrying'
end

-- The jobs with a start deadline (`expiring`, the key feature_keys names
-- too): the trimming of finished jobs (retention.lua, purge.lua) takes
-- theirs out, after one EXISTS a call, so a queue without deadlines pays no
-- more; made alone, it spares those scripts the feature_keys table.
local function expiring_key(prefix)
  return prefix .. 'expiring'
end

-- The dedup fields held by a throttled job (a task with a dedup window,
-- docs/dedup.md), scored by when the reclaim's sweep looks at them next: the
-- claim adds a field at its lease's expiry, the completion at its window's
-- end (`dedup_until`); the sweep (reclaim.lua) frees a field whose job no
-- longer holds it (its window over, dead, cancelled, trimmed). Derived here:
-- only a throttled job's claim and completion reach it.
local function dedup_held_key(prefix)
  return prefix .. 'dedup:held'
end

-- The dedup index, for complete.lua: it reaches it only for a throttled job
-- (a key in its KEYS would cost every completion, feature_keys says why).
local function dedup_index_key(prefix)
  return prefix .. 'dedup'
end

-- The queue-wide keys a finishing job's dependents move between (graph.lua):
-- derived here, from the prefix, and only when the job has dependents. They
-- are known before the call and would belong in KEYS, but seven more KEYS
-- cost every call of the five finish scripts ~18,700 Redis instructions
-- (+3.7% for claim + complete at batch 1, benchmarks/redis_cost.py) for a
-- feature most queues never use; derived, a job nobody waits on pays nothing
-- for them. The pending sets come as a table by priority label, so a
-- priority field picks one of these four names, never makes one.
local function graph_queue_keys(prefix)
  return {
    waiting = prefix .. 'waiting', dead = prefix .. 'dead', wake = prefix .. 'wake',
    pending = {critical = prefix .. 'pending:critical', high = prefix .. 'pending:high',
      normal = prefix .. 'pending:normal', low = prefix .. 'pending:low'},
  }
end

-- The metrics history's two hashes of a moment (history.lua): the minute and
-- the hour starting at `minute_s` and `hour_s` (epoch seconds, as strings).
local function history_keys(prefix, minute_s, hour_s)
  return prefix .. 'history:m:' .. minute_s, prefix .. 'history:h:' .. hour_s
end
