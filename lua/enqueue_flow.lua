-- enqueue_flow: create jobs that wait for other jobs (docs/workflows.md), all
-- or none: `queue.enqueue(task, after=[...])` (one job) and
-- `queue.enqueue_flow(parent, children)` (a tree: children first, each job
-- after the jobs it waits on, so every dependency in this call is written
-- before the job that waits on it).
--
-- KEYS[1] waiting zset   KEYS[2] wake list
-- KEYS[3..6] pending zsets, CRITICAL first: a job's priority picks one
-- KEYS[7] queue meta hash (its `events` field: include events.lua; each
--         job created is an `enqueued` event, as enqueue.lua's are; its
--         `history` field: include history.lua, the jobs created by kind)
-- KEYS[8] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''
-- ARGV[2] key prefix of the queue ("venturi:{q}:"); job, journal and graph
--         keys derive from it (keys.lua job_keys, graph_keys)
-- ARGV[3] number of jobs n
-- ARGV[4..] per job: job_args.lua's layout (JOB_ARGS, then its optional
--         field, value pairs, stored as enqueue.lua stores them; its dedup
--         field is always ''; a job of a limited kind is parked by the claim
--         that first reaches it, limits.lua), then policy ('fail' |
--         'ignore'), k = how many ids it waits on, then those k ids (each an
--         earlier job of this call or a job of the queue)
--
-- A job whose dependencies have all completed already is written pending,
-- as enqueue.lua would; any other is WAITING: in the waiting zset, its set
-- `deps:<id>` holding what it still waits on, and its id added to each
-- dependency's `dependents:<id>` (with the flag field `dependents` = '1' on
-- the dependency's hash, which the finish paths test: graph.lua). Results of
-- dependencies already completed are copied now, as graph.lua copies them at
-- completion. A waiting job's journal is written at once: the `enqueued`
-- entry, then `waiting` (with the ids).
--
-- Returns {now, created}: created = 0 for a resend (the first job exists:
-- ids are fresh per call, so a resend of this very call; nothing written).
-- Errors (checked before any write, so nothing is written):
--   VR_BADARG when a dependency is not a job of this queue, or is dead or
--   cancelled and the job waiting on it has the `fail` policy.

-- @include clock.lua
-- @include keys.lua
-- @include journal.lua
-- @include wake.lua
-- @include events.lua
-- @include job_args.lua
-- @include history.lua

local GRAPH_IDS_SHOWN_AT_ENQUEUE = 20

local now = now_ms(ARGV[1])
local now_s = str(now)
local prefix = ARGV[2]
local n = tonumber(ARGV[3])
events_open(KEYS[7], events_key(prefix), prefix)
history_counts = redis.call('HGET', KEYS[7], 'history') == '1' and {} or nil

-- Parse, then check every dependency before the first write.
local jobs, new = {}, {}
local a = 4
for i = 1, n do
  local id, kind, priority, delay, _, payload, m, first = job_at(a)
  a = first + 2 * m
  local job = {id = id, kind = kind, priority = priority, delay = delay, payload = payload,
    first = first, m = m, policy = ARGV[a], deps = {}}
  local k = tonumber(ARGV[a + 1])
  for j = 1, k do
    job.deps[j] = ARGV[a + 1 + j]
  end
  a = a + 2 + k
  jobs[i] = job
end
if redis.call('EXISTS', (job_keys(prefix, jobs[1].id))) == 1 then
  return {now, 0}
end
local known = {} -- dependency id -> {state, kind, result} of a job already in the queue
for _, job in ipairs(jobs) do
  if pending_key(3, job.priority) == nil then
    return redis.error_reply('VR_BADARG unknown priority ' .. job.priority)
  end
  for _, dep in ipairs(job.deps) do
    if not new[dep] and not known[dep] then
      local f = redis.call('HMGET', (job_keys(prefix, dep)), 'state', 'kind', 'result')
      if not f[1] then
        return redis.error_reply('VR_BADARG job ' .. job.id .. ' cannot wait on ' .. dep ..
          ': no such job in this queue (purged, or never enqueued here)')
      end
      known[dep] = f
    end
    local f = known[dep]
    if f and (f[1] == 'dead' or f[1] == 'cancelled') and job.policy ~= 'ignore' then
      return redis.error_reply('VR_BADARG job ' .. job.id .. ' cannot wait on ' .. dep ..
        ': it is ' .. f[1] .. ' (a task whose on_dependency_failure() is "ignore" can)')
    end
  end
  new[job.id] = true
end

local made = 0
for _, job in ipairs(jobs) do
  local id = job.id
  local job_key, journal_key = job_keys(prefix, id)
  local deps_key, _, results_key = graph_keys(prefix, id)
  local eligible_s = job.delay == '0' and now_s or str(now + tonumber(job.delay))
  local waits = {}
  for _, dep in ipairs(job.deps) do
    local f = known[dep]
    if f and f[1] == 'completed' then
      redis.call('HSET', results_key, dep, (f[2] or '') .. '\n' .. (f[3] or ''))
    elseif not f or (f[1] ~= 'dead' and f[1] ~= 'cancelled') then
      waits[#waits + 1] = dep
    end
  end
  local state = #waits > 0 and 'waiting' or 'pending'
  write_job(prefix, id, job_key, state, job.kind, job.priority, eligible_s, now_s, job.payload, '', job.first, job.m)
  if job.policy == 'ignore' then
    redis.call('HSET', job_key, 'on_dependency_failure', 'ignore')
  end
  if events_stream then
    emit(id, job.kind, 'enqueued', now_s, 0, nil, {'priority', job.priority, 'eligible_at', eligible_s})
  end
  if history_counts then history_count(job.kind, 'enqueued', 1) end
  if #waits == 0 then
    redis.call('ZADD', pending_key(3, job.priority), eligible_s, id)
    made = made + 1
  else
    redis.call('ZADD', KEYS[1], now_s, id)
    for _, dep in ipairs(waits) do
      local dep_key = job_keys(prefix, dep)
      local _, dependents_key = graph_keys(prefix, dep)
      redis.call('SADD', deps_key, dep)
      redis.call('SADD', dependents_key, id)
      redis.call('HSET', dep_key, 'dependents', '1', 'hooks', '1')
    end
    write_enqueued(journal_key, {now_s, job.priority, eligible_s})
    redis.call('HSET', job_key, 'run_count', '0') -- it has a journal now (journal.lua materialize)
    local shown = {}
    for j = 1, math.min(#waits, GRAPH_IDS_SHOWN_AT_ENQUEUE) do shown[j] = waits[j] end
    journal(journal_key, now_s, 'waiting', 0, 'waiting on ' .. #waits .. ' job(s)', nil,
      {'ids', table.concat(shown, ' '), 'count', str(#waits)})
    compact_journal(journal_key)
  end
end
if made > 0 then
  wake_workers(KEYS[2], made)
end
if history_counts then history_flush(prefix, now) end
return {now, n}
