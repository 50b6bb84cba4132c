-- A job ending CANCELLED: by an operator (cancel.lua), or by the claim that
-- finds a cancel requested while the job's last run was ending (claim.lua).

-- @include journal.lua
-- @include offload.lua

-- The job's hash, the cancelled set, its journal and an offload's snapshot
-- (settled as failed: its caller is waiting in resolve()). The caller has
-- taken the job out of its set, and materialized its journal. `owner` and
-- `claimed`: the claim of the run this ends (a worker ending its own run
-- cancelled; nil otherwise), for the entry (journal.lua with_claim).
local function finish_cancelled(prefix, job_key, journal_key, cancelled_key, id, now, run, note, from,
    owner, claimed)
  redis.call('HSET', job_key, 'state', 'cancelled', 'note', note, 'finished_at', now, 'updated_at', now)
  redis.call('HDEL', job_key, 'eligible_at')
  redis.call('ZADD', cancelled_key, now, id)
  journal(journal_key, now, 'cancelled', run, note, nil, with_claim({'from', from}, owner, claimed))
  compact_journal(journal_key)
  offload_settle(prefix, job_key, id, 'failed', nil, 'cancelled: ' .. note, now)
end
