-- Fibonacci backoff with deterministic jitter; mirrors venturi_redis/_backoff.py.
-- Integer milliseconds throughout; every intermediate stays below 2^53 so
-- Lua 5.1 doubles and Python ints agree exactly.
local function jitter_fraction(job_id, attempt)
  local h = attempt % 2147483647
  for i = 1, #job_id do
    h = (h * 48271 + string.byte(job_id, i)) % 2147483647
  end
  for _ = 1, 3 do
    h = (h * 48271 + attempt) % 2147483647
  end
  return h / 2147483647
end

local function backoff_delay_ms(job_id, attempt, base_ms, cap_ms, jitter)
  if base_ms <= 0 or cap_ms <= 0 then
    return 0
  end
  local a, b = 1, 1
  for _ = 1, attempt - 1 do
    a, b = b, a + b
    if base_ms * (a - 1) >= cap_ms then
      break
    end
  end
  local d = math.min(base_ms * (a - 1), cap_ms)
  if d <= 0 or jitter <= 0 then
    return d
  end
  return d - math.floor(d * jitter * jitter_fraction(job_id, attempt))
end
