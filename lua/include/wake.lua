-- Waking idle workers.

-- Wake idle workers: push one token per job made claimable onto the queue's
-- wake list. An idle worker blocks on that list with BLPOP, its claim
-- pipelined behind (docs/design.md, "Waking workers"), so a token wakes
-- exactly one worker and a job pushed while no worker listened is not lost.
-- A worker whose claim comes back short deletes the list (every token in it
-- is stale by then); the cap bounds it when no worker runs.
-- (WAKE_CAP: venturi_redis/_store/keys.py's, tests/test_wake.py checks.)
local WAKE_CAP = 1024
local function wake_workers(key, n)
  -- Tokens beyond the cap are not pushed (an LTRIM after the push cost
  -- more than the rest of a one-job enqueue while no worker drained them).
  local room = WAKE_CAP - redis.call('LLEN', key)
  if n > room then n = room end
  if n < 1 then return end
  local tokens = {}
  for i = 1, n do tokens[i] = '1' end
  redis.call('RPUSH', key, unpack(tokens))
end
