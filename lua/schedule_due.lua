-- schedule_due: the schedules due now, by the scripts' clock (read only).
--
-- KEYS[1]      the due index: active schedule ids scored by next fire time (ms)
-- KEYS[2] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1]      now in ms, or '' for Redis TIME
-- ARGV[2]      key prefix of the queue (unused here; every script takes it)
-- ARGV[3]      most ids returned
--
-- One ZRANGEBYSCORE with LIMIT: the work does not grow with the schedules
-- that are not due.
--
-- Returns {now, earliest, id, id, ...}: the ids due (score <= now), earliest
-- first; `earliest` is the lowest score in the index (-1: the index is empty),
-- for the caller to sleep until it.
-- Errors: VR_WRONGTYPE when the due index is not a sorted set.

-- @include clock.lua
-- @include schedule.lua

local now = now_ms(ARGV[1])
local broken = wrong_type(KEYS[1], 'zset')
if broken then
  return redis.error_reply('VR_WRONGTYPE ' .. broken)
end
local out = {now, -1}
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  out[2] = tonumber(first[2])
  if out[2] <= now then
    local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', str(now), 'LIMIT', 0, tonumber(ARGV[3]))
    for i = 1, #due do
      out[#out + 1] = due[i]
    end
  end
end
return out
