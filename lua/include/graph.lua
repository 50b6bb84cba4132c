-- Workflows (docs/workflows.md): jobs that wait for other jobs.
--
-- A WAITING job holds the ids it still waits on in `deps:<id>` (a set) and
-- sits in the `waiting` zset (scored by enqueue time, for counts and
-- listings). Each job waited on holds the waiting ids in `dependents:<id>`
-- (a set, kept until the job is purged so `venturi job show` can tell both
-- ways) and the field `dependents` = '1' on its hash: the one thing the
-- finish paths read for a job nobody waits on (read in a HMGET they make
-- anyway), so a queue without workflows pays nothing else.
--
-- When a job finishes, the script that finishes it calls graph_release in
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
-- G: where the graph's queue-wide keys are in KEYS (graph_at): the waiting
-- zset, the dead zset, the wake list, then the four pending sets.

-- @include keys.lua
-- @include journal.lua
-- @include offload.lua
-- @include quarantine.lua
-- @include wake.lua

local function graph_at(first)
  return {waiting = KEYS[first], dead = KEYS[first + 1], wake = KEYS[first + 2],
    pending = first + 3}
end

-- The last dependency of a waiting job is done: to pending, eligible at its
-- enqueue-time eligible_at, or now if that has passed. Returns 1 when it was
-- made claimable (the caller wakes that many workers).
local function graph_ready(G, job_key, journal_key, id, f, now)
  redis.call('ZREM', G.waiting, id)
  local pending = pending_key(G.pending, f[3])
  if not pending then
    quarantine(job_key, journal_key, G.dead, id, now, bad_priority(f[3]))
    return 0
  end
  local eligible = tonumber(f[4]) or now
  if eligible < now then eligible = now end
  local e = str(eligible)
  redis.call('HSET', job_key, 'state', 'pending', 'eligible_at', e, 'updated_at', str(now))
  redis.call('ZADD', pending, e, id)
  journal(journal_key, now, 'ready', 0, 'every dependency finished', nil, nil)
  compact_journal(journal_key)
  return 1
end

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

-- Job `id` (of KIND `kind`) finished: `ok` = completed (with `value`, its
-- msgpack result or ''), else dead or cancelled (`why`, its note). Each
-- dependent still waiting on it is told: a completion or an `ignore`
-- dependent counts it done; a `fail` dependent goes dead (reason
-- dependency_failed), and its own dependents are told in turn. The cascade is
-- a work list, not a recursion: a chain of any depth costs no Lua stack, and
-- each job goes dead at most once (only a WAITING job can, and it leaves
-- WAITING as it does). Returns the number of jobs made pending.
local function graph_release(prefix, G, id, kind, now, ok, value, why)
  local made = 0
  local work = {{id, kind, ok, why}}
  local i = 1
  while i <= #work do
    local src, src_kind, src_ok, src_why = work[i][1], work[i][2], work[i][3], work[i][4]
    i = i + 1
    local _, dependents_key = graph_keys(prefix, src)
    for _, dep in ipairs(redis.call('SMEMBERS', dependents_key)) do
      local job_key, journal_key = job_keys(prefix, dep)
      local deps_key, _, results_key = graph_keys(prefix, dep)
      local f = redis.call('HMGET', job_key, 'state', 'on_dependency_failure', 'priority',
        'eligible_at', 'kind')
      -- SREM answers 0 when `src` was counted already (a dependency retried
      -- from dead and finishing again): nothing is told twice.
      if f[1] == 'waiting' and redis.call('SREM', deps_key, src) == 1 then
        if src_ok then
          redis.call('HSET', results_key, src, (src_kind or '') .. '\n' .. (value or ''))
          journal(journal_key, now, 'dependency_completed', 0, nil, nil, {'dependency', src})
        else
          journal(journal_key, now, 'dependency_failed', 0, src_why, nil,
            {'dependency', src, 'policy', f[2] == 'ignore' and 'ignore' or 'fail'})
        end
        if src_ok or f[2] == 'ignore' then
          if redis.call('EXISTS', deps_key) == 0 then
            made = made + graph_ready(G, job_key, journal_key, dep, f, now)
          end
        else
          graph_detach(prefix, dep)
          redis.call('ZREM', G.waiting, dep)
          local note = 'dependency ' .. src .. ' failed: ' .. (src_why or '')
          local n = str(now)
          redis.call('HSET', job_key, 'state', 'dead', 'note', note, 'finished_at', n,
            'updated_at', n)
          redis.call('HDEL', job_key, 'eligible_at')
          redis.call('ZADD', G.dead, n, dep)
          journal(journal_key, now, 'dead', 0, note, nil,
            {'reason', 'dependency_failed', 'dependency', src})
          compact_journal(journal_key)
          offload_settle(prefix, job_key, dep, 'failed', nil, note, n)
          work[#work + 1] = {dep, f[5], false, note}
        end
      end
    end
  end
  return made
end

-- graph_release for a job whose hash says someone waits on it (`flag`: its
-- `dependents` field), waking the workers for what it made pending. The
-- finish paths call this; a job with no dependents costs only the flag test.
local function graph_finished(prefix, G, flag, job_key, id, now, ok, value, why)
  if flag ~= '1' then
    return
  end
  local kind = redis.call('HGET', job_key, 'kind')
  local made = graph_release(prefix, G, id, kind, now, ok, value, why)
  if made > 0 then
    wake_workers(G.wake, made)
  end
end
