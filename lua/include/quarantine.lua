-- Quarantine: a job whose own data is corrupt (a priority that names no
-- pending set, a missing kind or state, a state that is not the set's, a
-- created_at that is not a time, a job or journal key of the wrong type)
-- goes DEAD at once, reason `corrupt`, with a note naming what was wrong,
-- instead of failing the script for every other job of its call. It is in
-- the dead set, so it is counted and listed like any dead job, and
-- `venturi dead retry` gives it back once an operator has repaired it.
-- docs/guarantees.md states the rule; tests/test_quarantine.py tries each case.

-- @include journal.lua

-- `what`: the note. The caller has taken the id out of the set it was found
-- in. What cannot be written is skipped: a job key that is not a hash keeps
-- its value, a journal key that is not a stream gets no entry. Rare, so the
-- two TYPE reads cost nothing on the paths that never quarantine.
local function quarantine(job_key, journal_key, dead_key, id, now, what)
  local hash = redis.call('TYPE', job_key).ok == 'hash'
  local stream = redis.call('TYPE', journal_key).ok
  local journaled = stream == 'stream' or stream == 'none'
  if hash and journaled then
    materialize(job_key, journal_key) -- before the hash changes, when it can be dated
  end
  if hash then
    redis.call('HSET', job_key, 'state', 'dead', 'note', what, 'dead_reason', 'corrupt',
      'finished_at', now, 'updated_at', now)
    redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'eligible_at')
  end
  redis.call('ZADD', dead_key, now, id)
  if journaled then
    journal(journal_key, now, 'dead', 0, what, nil, {'reason', 'corrupt'})
  end
end
