-- Workflows (docs/workflows.md): jobs that wait for other jobs.
--
-- A WAITING job holds the ids it still waits on in `deps:<id>` (a set) and
-- sits in the `waiting` zset (scored by enqueue time, for counts and
-- listings). Each job waited on holds the waiting ids in `dependents:<id>`
-- (a set, kept until the job is purged so `venturi job show` can tell both
-- ways) and the field `dependents` = '1' on its hash: the one thing the
-- finish paths read for a job nobody waits on (one more field in a HMGET
-- they make anyway), so a queue without workflows pays nothing else.
--
-- When a job finishes, the script that finishes it calls graph_finished in
-- the same atomic step. Per dependent it costs O(1): SREM of the finished id
-- from the dependent's set, then EXISTS of that set; the dependent moves to
-- pending only when that set is empty, and only the script that emptied it
-- sees it empty (scripts do not interleave), so a parent of 10,000 children
-- becomes pending exactly once, whichever two children finish last.
--
-- A completed dependency's result is copied to the dependent's
-- `depresults:<id>` hash (field: the dependency's id; value: its KIND, a
-- newline, its msgpack result or nothing for None), so retention may purge
-- the dependency at any time after: the dependent never reads it again.
--
-- Everything but graph_finished is defined inside it: Redis runs a script's
-- whole body on every call, and each top-level `local function` is a closure
-- made per call; nested, they are made only for a job someone waits on.

-- @include keys.lua
-- @include journal.lua
-- @include offload.lua
-- @include wake.lua
-- @include quarantine.lua
-- @include history.lua

-- Take a job out of the sets of the jobs it waits on (it no longer waits:
-- cancelled, or dead by its policy), and drop its own set.
local function graph_detach(prefix, id)
  local deps_key = graph_keys(prefix, id)
  for _, other in ipairs(redis.call('SMEMBERS', deps_key)) do
    local _, other_dependents = graph_keys(prefix, other)
    redis.call('SREM', other_dependents, id)
  end
  redis.call('DEL', deps_key)
end

-- A job the claim ended (a cancel requested while it ran; a quarantine):
-- when others wait on it, it joins the `graph:orphans` set and the next
-- reclaim sweep tells its dependents (reclaim.lua). The claim keeps none of
-- the graph's code: in a script of claim's size each closure costs, and
-- carrying graph_finished cost every claim call ~14,000 Redis instructions
-- (benchmarks/redis_cost.py, batch 1), for two endings that are rare.
local function graph_orphaned(prefix, job_key, id)
  if redis.call('HGET', job_key, 'dependents') == '1' then
    redis.call('SADD', graph_orphans_key(prefix), id)
  end
end

-- The queue-wide keys graph_finished writes, checked once per script call
-- (nil: not yet; false: sound; else what is wrong with one of them).
local graph_queue_damage = nil

-- Take a waiting dependent whose own keys are damaged out of the graph: it
-- goes dead, reason corrupt, with `note` naming the key (quarantine.lua), and
-- what can be read of its sets is left as it was.
local function graph_quarantine(prefix, G, dep, note, now_s)
  local dep_key, journal_key = job_keys(prefix, dep)
  redis.call('ZREM', G.waiting, dep)
  local deps_key = graph_keys(prefix, dep)
  local others = redis.pcall('SMEMBERS', deps_key)
  if not others.err then
    for _, other in ipairs(others) do
      local _, other_dependents = graph_keys(prefix, other)
      redis.pcall('SREM', other_dependents, dep)
    end
    redis.call('DEL', deps_key)
  end
  quarantine(dep_key, journal_key, G.dead, dep, now_s, note)
end

-- Job `id` (its hash `job_key`) finished: `ok` = completed (with `value`, its
-- msgpack result or ''), else dead or cancelled (`why`, its note). `flag`:
-- the job's `dependents` field; anything but '1' returns at once. Each
-- dependent still waiting on it is told: a completion or an `ignore`
-- dependent counts it done; a `fail` dependent goes dead (reason
-- dependency_failed), and its own dependents are told in turn. The cascade is
-- a work list, not a recursion: a chain of any depth costs no Lua stack, and
-- each job goes dead at most once (only a WAITING job can, and it leaves
-- WAITING as it does). Workers are woken for the jobs made pending.
--
-- It never fails its script (issue 38): the finished job's own transition is
-- written by then, and so may be others of a batch. Every key of a dependent
-- is read before the first write to it, and a dependent whose own keys are
-- damaged (its hash, journal, `deps` or `depresults` of the wrong type) is
-- quarantined instead of told. A queue-wide key of the wrong type (the
-- waiting, dead or pending sets, the wake list) stops the telling before any
-- write: the job joins `graph:orphans`, whose reclaim sweep tells its
-- dependents once the key is repaired, and the server log says which key.
-- A finished job whose own `dependents` set is damaged finds its dependents
-- by the waiting set instead.
local function graph_finished(prefix, flag, job_key, id, now, ok, value, why)
  if flag ~= '1' then
    return
  end
  local G = graph_queue_keys(prefix)
  local now_s = str(now)
  if graph_queue_damage == nil then
    graph_queue_damage = false
    local want = {[G.waiting] = 'zset', [G.dead] = 'zset', [G.wake] = 'list'}
    for _, key in pairs(G.pending) do want[key] = 'zset' end
    for key, t in pairs(want) do
      local got = redis.call('TYPE', key).ok
      if got ~= t and got ~= 'none' then
        graph_queue_damage = key .. ' is not a ' .. (t == 'zset' and 'sorted set' or t)
      end
    end
  end
  if graph_queue_damage then
    redis.pcall('SADD', graph_orphans_key(prefix), id)
    if redis.log then
      redis.log(redis.LOG_WARNING, 'venturi: ' .. graph_queue_damage .. ': the dependents of job ' .. id ..
        ' are told once it is repaired')
    end
    return
  end

  -- The last dependency of a waiting job is done: to pending, eligible at
  -- its enqueue-time eligible_at, or now if that has passed. A priority
  -- field that names no pending set is corrupt data: the job goes dead with
  -- a note saying so (quarantine.lua's rule, written here in short).
  local function ready(dep_key, journal_key, dep, f)
    redis.call('ZREM', G.waiting, dep)
    local pending = G.pending[f[3] or '']
    if not pending then
      local note = bad_priority(f[3])
      redis.call('HSET', dep_key, 'state', 'dead', 'note', note, 'dead_reason', 'corrupt',
        'finished_at', now_s, 'updated_at', now_s)
      redis.call('HDEL', dep_key, 'eligible_at')
      redis.call('ZADD', G.dead, now_s, dep)
      journal(journal_key, now_s, 'dead', 0, note, nil, {'reason', 'corrupt'})
      return 0
    end
    local eligible = tonumber(f[4]) or now
    if eligible < now then eligible = now end
    local e = str(eligible)
    redis.call('HSET', dep_key, 'state', 'pending', 'eligible_at', e, 'updated_at', now_s)
    redis.call('ZADD', pending, e, dep)
    journal(journal_key, now_s, 'ready', 0, 'every dependency finished', nil, nil)
    compact_journal(journal_key)
    return 1
  end

  -- The jobs waiting on `src`: its `dependents` set, or, when that is
  -- damaged, the waiting jobs whose `deps` set holds it.
  local function dependents_of(src)
    local _, dependents_key = graph_keys(prefix, src)
    local members = redis.pcall('SMEMBERS', dependents_key)
    if not members.err then
      return members
    end
    local found = {}
    for _, w in ipairs(redis.call('ZRANGE', G.waiting, 0, -1)) do
      if redis.pcall('SISMEMBER', graph_keys(prefix, w), src) == 1 then found[#found + 1] = w end
    end
    return found
  end

  local made = 0
  local work = {{id, redis.pcall('HGET', job_key, 'kind'), ok, why}}
  local i = 1
  while i <= #work do
    local src, src_kind, src_ok, src_why = work[i][1], work[i][2], work[i][3], work[i][4]
    if type(src_kind) ~= 'string' then src_kind = '' end
    i = i + 1
    for _, dep in ipairs(dependents_of(src)) do
      local dep_key, journal_key = job_keys(prefix, dep)
      local deps_key, _, results_key = graph_keys(prefix, dep)
      local f = redis.pcall('HMGET', dep_key, 'state', 'on_dependency_failure', 'priority',
        'eligible_at', 'kind')
      -- Read before any write: is it waiting on `src` (not counted already:
      -- a dependency retried from dead and finishing again is told once), and
      -- is each of its keys of its type?
      local damaged, told = nil, false
      if f.err then
        damaged = dep_key .. ' is not a hash'
      elseif f[1] == 'waiting' then
        local member = redis.pcall('SISMEMBER', deps_key, src)
        if type(member) == 'table' then
          damaged = deps_key .. ' is not a set'
        elseif member == 1 then
          told = true
          if src_ok and type(redis.pcall('HEXISTS', results_key, src)) == 'table' then
            damaged = results_key .. ' is not a hash'
          elseif type(redis.pcall('XLEN', journal_key)) == 'table' then
            damaged = journal_key .. ' is not a stream'
          end
        end
      end
      if damaged then
        local note = 'workflow data is corrupt: ' .. damaged
        graph_quarantine(prefix, G, dep, note, now_s)
        work[#work + 1] = {dep, not f.err and f[5] or '', false, note}
      elseif told then
        redis.call('SREM', deps_key, src)
        if src_ok then
          redis.call('HSET', results_key, src, src_kind .. '\n' .. (value or ''))
          journal(journal_key, now_s, 'dependency_completed', 0, nil, nil, {'dependency', src})
        else
          journal(journal_key, now_s, 'dependency_failed', 0, src_why, nil,
            {'dependency', src, 'policy', f[2] == 'ignore' and 'ignore' or 'fail'})
        end
        if src_ok or f[2] == 'ignore' then
          if redis.call('EXISTS', deps_key) == 0 then
            made = made + ready(dep_key, journal_key, dep, f)
          end
        else
          graph_detach(prefix, dep)
          redis.call('ZREM', G.waiting, dep)
          local note = 'dependency ' .. src .. ' failed: ' .. (src_why or '')
          redis.call('HSET', dep_key, 'state', 'dead', 'note', note, 'dead_reason', 'dependency_failed',
            'finished_at', now_s, 'updated_at', now_s)
          redis.call('HDEL', dep_key, 'eligible_at')
          redis.call('ZADD', G.dead, now_s, dep)
          journal(journal_key, now_s, 'dead', 0, note, nil,
            {'reason', 'dependency_failed', 'dependency', src})
          compact_journal(journal_key)
          offload_settle(prefix, dep_key, dep, 'failed', nil, note, now_s)
          -- Counted by the metrics history when the calling script opened it.
          if history_counts then
            local field = (f[5] or '') .. '\tdead'
            history_counts[field] = (history_counts[field] or 0) + 1
          end
          work[#work + 1] = {dep, f[5], false, note}
        end
      end
    end
  end
  if made > 0 then
    wake_workers(G.wake, made)
  end
end
