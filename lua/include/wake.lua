-- Waking idle workers.

-- Wake idle workers: push one token per job made claimable onto the queue's
-- wake list. An idle worker blocks on that list with BLPOP, its claim
-- pipelined behind (docs/design.md, "Waking workers"), so a token wakes
-- exactly one worker and a job pushed while no worker listened is not lost.
-- A worker whose claim comes back short deletes the list (every token in it
-- is stale by then); the cap bounds it when no worker runs: the push says
-- the list's length, and only a list past the cap (no worker drained it) is
-- trimmed, so the usual push is one command. The trim keeps half the cap
-- (or this push's tokens, when more), not the cap: a list at the cap is one
-- that busy workers do not drain, and trimming it back to the cap would
-- cost every later push a second command (a trim per 512 pushes instead).
-- (WAKE_CAP: venturi_redis/_store/keys.py's, tests/test_wake.py checks.)
local WAKE_CAP = 1024
local function wake_workers(key, n)
  if n > WAKE_CAP then n = WAKE_CAP end
  if n < 1 then return end
  local len
  if n == 1 then
    len = redis.call('RPUSH', key, '1')
  else
    local tokens = {}
    for i = 1, n do tokens[i] = '1' end
    len = redis.call('RPUSH', key, unpack(tokens))
  end
  if len > WAKE_CAP then
    redis.call('LTRIM', key, -math.max(n, WAKE_CAP / 2), -1)
  end
end
