-- order_pause: pause an order key, or resume it (queue.pause_key / resume_key;
-- docs/semantics.md "Ordered keys", include order.lua).
--
-- KEYS[1] order:held hash   KEYS[2] order:queue zset   KEYS[3] order:paused set
-- KEYS[4] order:seq counter   KEYS[5] wake list
-- KEYS[6..9] pending zsets, CRITICAL first (a held-back holder leaves them all:
--         its priority field is not trusted to name its set)
-- KEYS[10] limits:parked zset: a holder parked on a limit is held back from there
-- KEYS[11] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''
-- ARGV[2] key prefix of the queue (job hashes derive from it)
-- ARGV[3] the order key
-- ARGV[4] '1' to pause, '' to resume
--
-- Pause: no job of the key starts until it is resumed. A holder still
-- pending (not started yet, or waiting for its retry) is held back: out of
-- its pending set (or the parked set), first in the key's queue, and the key
-- is free; a running or suspended holder goes on, and when it finishes the
-- key stays free and its next job waits. Jobs enqueued meanwhile wait too.
-- Resume: the key's first waiting job holds it and goes to its pending set
-- (a worker is woken), unless a holder still is pending, running,
-- retrying or suspended. A holder that has finished or is gone (its key was
-- left held: a damaged order key when it ended) is replaced here.
--
-- Returns 1 when the key's pause changed, 0 when it already was so.
-- Errors: VR_WRONGTYPE when one of the order keys is of the wrong type
-- (nothing written).

-- @include keys.lua
-- @include limits.lua
-- @include order.lua

local prefix, key = ARGV[2], ARGV[3]
local ok = {held = KEYS[1], queue = KEYS[2], paused = KEYS[3], seq = KEYS[4], wake = KEYS[5],
  pending = {critical = KEYS[6], high = KEYS[7], normal = KEYS[8], low = KEYS[9]}}
local ol = order_lib(feature_keys, graph_queue_keys, job_keys)
local broken = ol.broken(ok)
if broken then
  return redis.error_reply('VR_WRONGTYPE ' .. broken)
end
local holder = redis.call('HGET', ok.held, key)
if ARGV[4] == '1' then
  local changed = redis.call('SADD', ok.paused, key)
  if holder then
    local job_key = job_keys(prefix, holder)
    local f = redis.pcall('HMGET', job_key, 'state', 'parked', 'ordered')
    if not f.err and f[1] == 'pending' and not f[3] then
      for i = 6, 9 do redis.call('ZREM', KEYS[i], holder) end
      if f[2] then
        limits_lib().unpark(KEYS[10], f[2])
        redis.call('HDEL', job_key, 'parked')
      end
      -- Sequence 0: before every job of the key, which were enqueued after it.
      local member = key .. ol.SEP .. string.rep('0', 16) .. holder
      redis.call('ZADD', ok.queue, 0, member)
      redis.call('HSET', job_key, 'ordered', member)
      redis.call('HDEL', ok.held, key)
    end
  end
  return changed
end
local changed = redis.call('SREM', ok.paused, key)
if holder then
  local state = redis.pcall('HGET', job_keys(prefix, holder), 'state')
  if type(state) == 'table' or not state or state == 'completed' or state == 'dead'
      or state == 'cancelled' then
    holder = nil -- finished or gone: it holds nothing any more
  end
end
if not holder then
  ol.next(prefix, ok, key)
end
return changed
