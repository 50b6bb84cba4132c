-- extend: renew the leases a worker still holds, in one call per worker tick.
--
-- KEYS[1] running zset
-- ARGV[1] key prefix of the queue   ARGV[2] now in ms or ''
-- ARGV[3..] triples: job id, lease token, lease ms
--
-- Returns the ids whose lease this worker no longer holds (reclaimed,
-- finished, or gone); their leases are not touched. A job still held whose
-- cancel an operator requested (cancel.lua) is renewed and listed as
-- 'cancel:' .. id, so its worker asks the handler to stop.

-- @include common.lua

local prefix = ARGV[1]
local now = now_ms(ARGV[2])
local lost = {}
for i = 3, #ARGV, 3 do
  local id, token, lease = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local job_key = prefix .. 'job:' .. id
  local f = redis.call('HMGET', job_key, 'state', 'lease_token', 'cancel_requested')
  if f[1] == 'running' and f[2] == token then
    local expires = now + lease
    redis.call('HSET', job_key, 'lease_expires', expires)
    redis.call('ZADD', KEYS[1], expires, id)
    if f[3] then
      lost[#lost + 1] = 'cancel:' .. id
    end
  else
    lost[#lost + 1] = id
  end
end
return lost
