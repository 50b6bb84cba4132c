-- The per-job layout of enqueue.lua's and enqueue_flow.lua's ARGV, written
-- once (calls.py JOB_ARGS names it; tests/test_layouts.py checks they agree):
-- id, kind, priority, delay_ms, dedup field ('' = none), payload, m, then m
-- field, value pairs: the job hash's optional fields this job has (carry,
-- lease_ms, max_failures, timeout_ms, limit_key, trace, ...), written as
-- they come. A new optional field of a job is one more pair: no script
-- changes to store it.

-- @include clock.lua

local JOB_ARGS = 7

-- The job at ARGV[a]: its seven fixed values, and the index of its first pair.
local function job_at(a)
  return ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5],
    tonumber(ARGV[a + 6]), a + JOB_ARGS
end

-- Write a new job's hash in one HSET: the fields every job has, its dedup
-- field, and its `m` optional pairs from ARGV[first]. Only what is not
-- derivable: the id is in the key, and run_count, failures (absent = 0) and
-- updated_at (absent = created_at) are written by the first script that
-- changes them.
local function write_job(job_key, state, kind, priority, eligible_s, now_s, payload, dedup, first, m)
  if dedup == '' and m == 0 then
    redis.call('HSET', job_key, 'kind', kind, 'state', state, 'priority', priority,
      'eligible_at', eligible_s, 'created_at', now_s, 'payload', payload)
    return
  end
  local args = {'HSET', job_key, 'kind', kind, 'state', state, 'priority', priority,
    'eligible_at', eligible_s, 'created_at', now_s, 'payload', payload}
  local k = 14
  if dedup ~= '' then
    args[15], args[16] = 'dedup', dedup
    k = 16
  end
  for j = first, first + 2 * m - 1 do
    k = k + 1
    args[k] = ARGV[j]
  end
  redis.call(unpack(args))
end

-- The value of the optional field `name` among a job's m pairs at ARGV[first] ('' = none).
local function job_extra(first, m, name)
  for j = first, first + 2 * m - 2, 2 do
    if ARGV[j] == name then return ARGV[j + 1] end
  end
  return ''
end
