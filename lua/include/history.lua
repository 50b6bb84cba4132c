-- Metrics history (docs/observability.md "Metrics history"): per queue, per
-- KIND and per minute, the jobs enqueued, completed, failed runs, dead, and
-- the sum of the completed runs' times in ms (for the mean), counted by the
-- script that makes each transition, in the same atomic step.
--
-- Two hashes a period, fields `<kind>\t<counter>` (a KIND is printable: no
-- tab), counters `enqueued`, `completed`, `failed`, `dead`, `run_ms`:
-- * `history:m:<s>`, the minute starting at <s> (epoch seconds), expiring
--   48 h after that minute's end;
-- * `history:h:<s>`, the hour starting at <s>, expiring 30 days after its end.
-- A script counts per call, not per job: its jobs' counts are summed by kind
-- first, then written with one HINCRBY per kind, counter and hash
-- (history_flush): a batch of 100 completions of one kind costs four.
-- The expiry is absolute (PEXPIREAT), set whenever a HINCRBY makes a field
-- (its reply is the amount), so a key never outlives its period's window.
--
-- Off by default (it costs the hot path: docs/observability.md gives the
-- figures). The switch is the queue meta hash's field `history`: '1' = on.
--
-- History is the last write of its script and never fails it: each HINCRBY
-- runs in a pcall, and a history key of the wrong type (or a field that is
-- no integer, made by hand) loses that count, with a WARNING in the Redis
-- server's log, while the transition stands (as events.lua does).

-- @include clock.lua
-- @include keys.lua

-- The switch: only '1' turns it on; absent (or anything else) is off
-- (tests/test_history.py checks this against _store/calls_obs.py's
-- HISTORY_DEFAULT). A script opens its call's counts, once, inline:
--   history_counts = <the meta hash's `history` field> == '1' and {} or nil
-- no function: a script runs its whole body every call, and each top-level
-- function is a closure made per call, which a queue without history should
-- not pay for (benchmarks/redis_cost.py).

-- This call's counts while history is on, field (`<kind>\t<counter>`) ->
-- amount; nil while off, or not opened (a script that does not count). The
-- hot paths (enqueue, complete, claim, graph.lua) add to it inline,
--   history_counts[f] = (history_counts[f] or 0) + n
-- rather than through history_count: a helper they reference is a closure
-- made on every call of theirs, history or not.
local history_counts = nil

-- Count `n` of `counter` for `kind` (the caller checks `history_counts` first).
local function history_count(kind, counter, n)
  local field = kind .. '\t' .. counter
  history_counts[field] = (history_counts[field] or 0) + n
end

-- Write this call's counts to the minute and the hour of `now` (ms): one
-- HINCRBY per field and hash, and the hash's expiry when a HINCRBY made its
-- field (the reply is the amount). Its helper is defined inside, made only
-- while history is on; the caller checks `history_counts` first.
local function history_flush(prefix, now)
  -- How long a minute's and an hour's hash outlive their period (ms).
  local minute_keep, hour_keep = 48 * 3600000, 30 * 24 * 3600000
  local minute, hour = now - now % 60000, now - now % 3600000
  local mkey, hkey = history_keys(prefix, str(minute / 1000), str(hour / 1000))
  local mexp, hexp = str(minute + 60000 + minute_keep), str(hour + 3600000 + hour_keep)
  local function incr(key, field, n, expire_at)
    local r = redis.pcall('HINCRBY', key, field, n)
    if type(r) == 'table' then
      if redis.log then
        redis.log(redis.LOG_WARNING, 'venturi: history not written to ' .. key .. ': ' .. tostring(r.err))
      end
    elseif r == n then
      redis.pcall('PEXPIREAT', key, expire_at)
    end
  end
  for field, n in pairs(history_counts) do
    if n > 0 then
      incr(mkey, field, n, mexp)
      incr(hkey, field, n, hexp)
    end
  end
end
