-- extend: renew the leases a worker still holds, in one call per worker tick.
--
-- KEYS[1] running zset
-- KEYS[2] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''   ARGV[2] key prefix of the queue (job keys derive from it)
-- ARGV[3..] triples: job id, lease token, lease ms
--
-- Returns {lost, cancel}: the ids whose lease this worker no longer holds
-- (reclaimed, finished, or gone; their leases are not touched), and the ids
-- still held whose cancel an operator requested (cancel.lua): those are
-- renewed, and their worker asks the handler to stop.

-- @include clock.lua
-- @include keys.lua

local prefix = ARGV[2]
local now = now_ms(ARGV[1])
local lost, cancel = {}, {}
for i = 3, #ARGV, 3 do
  local id, token, lease = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local job_key = job_keys(prefix, id)
  -- pcall: a job key of the wrong type is a lease lost, not an error for every job.
  local f = redis.pcall('HMGET', job_key, 'state', 'lease_token', 'cancel_requested')
  if not f.err and f[1] == 'running' and f[2] == token then
    local expires = str(now + lease)
    redis.call('HSET', job_key, 'lease_expires', expires)
    redis.call('ZADD', KEYS[1], expires, id)
    if f[3] then
      cancel[#cancel + 1] = id
    end
  else
    lost[#lost + 1] = id
  end
end
return {lost, cancel}
