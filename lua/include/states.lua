-- Every state a job can be in (venturi_redis JobState; tests/test_lua_rules.py
-- checks the two agree): another value in a job's `state` was written by hand.
local JOB_STATES = {pending = true, waiting = true, running = true, suspended = true,
  completed = true, dead = true, cancelled = true}
