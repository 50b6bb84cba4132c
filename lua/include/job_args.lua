-- The per-job layout of enqueue.lua's and enqueue_flow.lua's ARGV, written
-- once (calls.py JOB_ARGS names it; tests/test_layouts.py checks they agree):
-- id, kind, priority, delay_ms, dedup field ('' = none), payload, m, then m
-- field, value pairs: the job hash's optional fields this job has (carry,
-- lease_ms, max_failures, timeout_ms, limit_key, trace, ...), written as
-- they come. A new optional field of a job is one more pair: no script
-- changes to store it. One pair is read as it is stored: `expires_at` comes
-- as ms from the script's clock (enqueue(expires=...)) and is stored as that
-- clock plus them, the start deadline on Redis's clock, and the job joins the
-- `expiring` index (keys.lua feature_keys) the reclaim sweep reads.

-- @include clock.lua
-- @include keys.lua

local JOB_ARGS = 7

-- The job at ARGV[a]: its seven fixed values, and the index of its first pair
-- (m is 0 for enqueue.lua's short layout, which stops after the payload).
local function job_at(a)
  return ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5],
    tonumber(ARGV[a + 6]) or 0, a + JOB_ARGS
end

-- Write a new job's hash in one HSET: the fields every job has, its dedup
-- field, and its `m` optional pairs from ARGV[first]. Only what is not
-- derivable: the id is in the key, and run_count, failures (absent = 0) and
-- updated_at (absent = created_at) are written by the first script that
-- changes them. `prefix` and `id` name the `expiring` index entry of a job
-- with a deadline.
local function write_job(prefix, id, job_key, state, kind, priority, eligible_s, now_s, payload, dedup, first, m)
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
  local deadline = nil
  for j = first, first + 2 * m - 1, 2 do
    args[k + 1], args[k + 2] = ARGV[j], ARGV[j + 1]
    if ARGV[j] == 'expires_at' then
      deadline = str(tonumber(now_s) + tonumber(ARGV[j + 1]))
      args[k + 2] = deadline
    end
    k = k + 2
  end
  redis.call(unpack(args))
  if deadline then
    redis.call('ZADD', feature_keys(prefix).expiring, deadline, id)
  end
end

-- The value of the optional field `name` among a job's m pairs at ARGV[first] ('' = none).
local function job_extra(first, m, name)
  for j = first, first + 2 * m - 2, 2 do
    if ARGV[j] == name then return ARGV[j + 1] end
  end
  return ''
end
