-- limit: set or clear a kind's limits (flow control, include limits.lua).
--
-- KEYS[1] limits hash   KEYS[2] limits:state hash   KEYS[3] limits:parked zset
-- KEYS[4] limits:ready zset   KEYS[5] queue meta hash (field `limits`: claims
--         read the limit keys only while it is set)
-- KEYS[6] wake list
-- KEYS[7] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''
-- ARGV[2] key prefix of the queue (unused here; every script takes it)
-- ARGV[3] 'set' or 'clear'   ARGV[4] kind   ARGV[5] '1' per key, '0' kind-wide
-- ARGV[6] concurrency, ARGV[7] rate count, ARGV[8] rate period in ms (set;
--         whole numbers, 0 = no such cap; calls.py has checked them)
--
-- Takes effect at once: every entity (kind, or kind and key) of the kind
-- with parked jobs is made ready again, so a raised or cleared cap frees the
-- jobs waiting on it (a claim re-checks each one: those still over a cap wait
-- again). A kind whose limits are all cleared keeps its parked jobs in the
-- rotation, served with no cap, until they are gone; new ones go to the
-- pending sets as usual. Running counts are kept: runs claimed under a cap
-- give their slot back when they end.
--
-- Returns 1 when a limit was set or cleared, 0 when clear found none.
-- Errors: VR_WRONGTYPE when one of its keys is of the wrong type (nothing
-- written: before, the limit was stored and the script failed after it, its
-- waiting jobs not readied). A stored config edited by hand is read as the
-- claim reads it (limits.lua limit_config) and written whole again.

-- @include clock.lua
-- @include limits.lua
-- @include types.lua
-- @include wake.lua

local broken = wrong_type(KEYS[1], 'hash') or wrong_type(KEYS[2], 'hash') or wrong_type(KEYS[3], 'zset')
  or wrong_type(KEYS[4], 'zset') or wrong_type(KEYS[5], 'hash') or wrong_type(KEYS[6], 'list')
if broken then
  return redis.error_reply('VR_WRONGTYPE ' .. broken)
end
local now = now_ms(ARGV[1])
local now_s = str(now)
local kind = ARGV[4]
local first = ARGV[5] == '1' and 4 or 1
local c = limits_lib().config(redis.call('HGET', KEYS[1], kind))
local changed = 1
if ARGV[3] == 'set' then
  c[first], c[first + 1], c[first + 2] = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
else
  if c[first] == 0 and c[first + 1] == 0 then
    changed = 0
  end
  c[first], c[first + 1], c[first + 2] = 0, 0, 0
end
if c[1] == 0 and c[2] == 0 and c[4] == 0 and c[5] == 0 then
  redis.call('HDEL', KEYS[1], kind)
else
  redis.call('HSET', KEYS[1], kind, table.concat(c, ' '))
  redis.call('HSET', KEYS[5], 'limits', '1')
end
if changed == 0 then
  return 0
end
-- Every waiting entity of the kind is ready again.
redis.call('HDEL', KEYS[2], kind .. '\t!')
local head = kind .. '\t'
local woke = 0
local entities = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. now_s, '+inf')
for _, e in ipairs(entities) do
  if string.sub(e, 1, #head) == head then
    redis.call('ZADD', KEYS[4], now_s, e)
    woke = woke + 1
  end
end
if woke > 0 then
  wake_workers(KEYS[6], woke)
end
return 1
