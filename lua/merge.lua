-- merge: apply a dedup merge decision to a pending job. Runs inside the
-- MULTI/EXEC of the client's optimistic loop, after a WATCH on the job hash,
-- so the job is known to be unchanged since the client read it; the state
-- check below is a second line of defence, made before any write.
--
-- KEYS[1] job hash   KEYS[2] journal stream
-- KEYS[3] pending zset of the job's current priority
-- KEYS[4] pending zset of the new priority (same as KEYS[3] when unchanged)
-- ARGV[1] job id   ARGV[2] now in ms or ''
-- ARGV[3] decision: keep | replace | with
-- ARGV[4] new payload (msgpack; ignored for keep)
-- ARGV[5] carry action: keep | reset | set   ARGV[6] carry (msgpack, for set)
-- ARGV[7] new priority label   ARGV[8] wake list
-- ARGV[9] the id the merging enqueue generated (journaled as `by`: after a
--         lost EXEC reply, the client finds it and does not merge again)
--
-- Returns 1, or 0 when the job is no longer pending (nothing written).

-- @include common.lua

local id = ARGV[1]
local f = redis.call('HMGET', KEYS[1], 'state', 'run_count', 'priority')
if f[1] ~= 'pending' then
  return 0
end
-- Journal the `enqueued` entry first if nothing has yet, while the hash still
-- holds the enqueue-time priority.
materialize(KEYS[1], KEYS[2])
local now = now_ms(ARGV[2])
local decision = ARGV[3]
local extra = {'decision', decision, 'by', ARGV[9]}
if decision ~= 'keep' then
  redis.call('HSET', KEYS[1], 'payload', ARGV[4], 'updated_at', now)
  if ARGV[5] == 'reset' then
    redis.call('HDEL', KEYS[1], 'carry')
  elseif ARGV[5] == 'set' then
    redis.call('HSET', KEYS[1], 'carry', ARGV[6])
  end
  if ARGV[7] ~= f[3] then
    local score = redis.call('ZSCORE', KEYS[3], id)
    redis.call('ZREM', KEYS[3], id)
    redis.call('ZADD', KEYS[4], score, id)
    redis.call('HSET', KEYS[1], 'priority', ARGV[7])
    extra[#extra + 1] = 'priority'
    extra[#extra + 1] = ARGV[7]
    wake_workers(ARGV[8], 1)
  end
end
journal(KEYS[2], now, 'merged', f[2], nil, nil, extra)
compact_journal(KEYS[2])
return 1
