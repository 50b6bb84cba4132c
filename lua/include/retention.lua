-- Retention inside the script that completes jobs (issue 47; complete.lua is
-- the one that includes this): each call that adds completed jobs removes up
-- to twice as many of the completed set's oldest jobs that are past the
-- queue's retention, by age or by count, whichever bound is reached first.
-- Trimming so keeps pace with completing at any rate, with one worker or
-- fifty, and each completed job pays O(1) for it: a queue over its bounds
-- holds at most about (rate x retention) completed jobs, plus what one call
-- adds. Dead and cancelled jobs, which come far slower, are trimmed by the
-- reclaim tick's sweep (ops.py trim, purge.lua), which also catches up a
-- queue whose jobs stopped finishing while older ones age out.
--
-- A trimmed job loses its hash, its journal, its workflow keys (keys.lua
-- graph_keys: the dependents set and the results copied to it) and its entry
-- in the `expiring` index (keys.lua expiring_key). Nothing else:
-- the results a dependent copied are the dependent's own (depresults of the
-- dependent), and an offload's snapshot lives on its own TTL, so a result
-- still awaited stays. Only members of the finished set are trimmed: a job
-- that is not finished is in no finished set.

-- @include keys.lua

-- Trim the finished set `set_key` after `added` jobs went in at `now`.
-- `keep_ms`: how long a finished job stays ('' = no age bound); `max`: how
-- many stay at most ('' = no count bound). Returns how many were removed.
local function trim_finished(prefix, set_key, now, keep_ms, max, added)
  if keep_ms == '' and max == '' then
    return 0
  end
  local budget = 2 * added
  if budget > 1000 then budget = 1000 end -- one DEL's arguments stay few
  local over = 0
  if max ~= '' then
    over = redis.call('ZCARD', set_key) - tonumber(max)
  end
  if over < budget and keep_ms ~= '' then
    -- The oldest `budget` may all be past their age: counted by score (log n).
    local aged = redis.call('ZCOUNT', set_key, '-inf', '(' .. str(now - tonumber(keep_ms)))
    if aged > over then over = aged end
  end
  if over <= 0 then
    return 0
  end
  if over > budget then over = budget end
  local ids = redis.call('ZRANGE', set_key, 0, over - 1)
  local doomed = {}
  for i, id in ipairs(ids) do
    local job_key, journal_key = job_keys(prefix, id)
    local _, dependents_key, results_key = graph_keys(prefix, id)
    local b = 4 * (i - 1)
    doomed[b + 1], doomed[b + 2], doomed[b + 3], doomed[b + 4] =
      job_key, journal_key, dependents_key, results_key
  end
  redis.call('ZREMRANGEBYRANK', set_key, 0, #ids - 1)
  redis.call('DEL', unpack(doomed))
  -- A job with a start deadline leaves its index with it, not at its
  -- deadline (before, a job enqueued with a day's deadline kept its entry a
  -- day however soon it was trimmed: every job of the day, for a busy queue).
  local exp_key = expiring_key(prefix)
  if redis.call('EXISTS', exp_key) == 1 then redis.call('ZREM', exp_key, unpack(ids)) end
  return #ids
end
