-- complete: RUNNING -> COMPLETED for one or more jobs of a queue, each for the
-- holder of its lease token only. Many jobs per call is the worker's batched
-- path: a burst of finished runs costs one script call, and each job is still
-- checked, written and journaled on its own (a refusal of one does not stop
-- the others).
--
-- KEYS[1] running zset   KEYS[2] completed zset
-- KEYS[3] queue meta hash (its `events` field: include events.lua; its
--         `history` field: include history.lua, the completions by kind and
--         their run times, each from its claim to now)
-- The event stream (while events are on) and, for a run holding a
-- concurrency slot, which it gives back (include limits.lua), the
-- limits:state hash, limits:ready zset and wake list: their names derived
-- from the prefix on those paths only (keys.lua), not in KEYS, which every
-- call pays for.
-- A throttled job (a `dedup_window`, read with the hooks: docs/dedup.md)
-- whose key the dedup index still gives holds it until `dedup_until`, now +
-- the window: that field on its hash, and the key's score in `dedup:held`
-- (both names derived from the prefix: keys.lua dedup_index_key).
-- A job others wait on (its `dependents` flag, read with the lease check)
-- tells them here, in the same step (graph.lua; the queue-wide keys that
-- takes derive from the prefix: keys.lua graph_queue_keys).
-- A job with an order key (its `hooks` flag) lets the key's next job go to
-- its pending set (order.lua; keys.lua feature_keys).
-- KEYS[4] the scratch key journal-compact, absent between calls: the slot guard (keys.lua)
-- ARGV[1] now in ms or ''
-- ARGV[2] key prefix of the queue ("venturi:{q}:"); job, journal and offload
--         snapshot keys derive from it (include offload.lua: an offload's
--         snapshot becomes `completed` with the result, and the redacted
--         wake-up is published)
-- ARGV[3] retention of completed jobs in ms ('' = no age bound)
-- ARGV[4] most completed jobs kept ('' = no count bound): the oldest past
--         either bound are trimmed here, up to twice as many as this call
--         completes (retention.lua)
-- ARGV[5] number of jobs n
-- ARGV[6..] 6 values per job: id, lease token, note, attachment (msgpack or
--         ''), carry (msgpack or '' = unchanged), result (msgpack or '')
--
-- Returns one value per job: 1 when completed, or the reason it was refused
-- (stale or unknown job; the refusal is journaled and nothing else is written
-- for that job; a job or journal key of the wrong type is refused with
-- nothing written, and quarantined by the reclaim).
-- Errors: VR_WRONGTYPE when the running or completed set is not a sorted set;
-- then no job is moved (only refusals are journaled).
--
-- Each completed job's journal gets one entry, `completed`, carrying its
-- run's claim (worker, claimed_at): its first, for a job that completes on
-- its first run (journal.lua says what its hash still implies). It is the
-- job's first write (XADD in a pcall, so a journal of the wrong type refuses
-- the job with nothing written); the job's hash then follows. The two sets
-- move every completed job at once, after the journals: their types are read
-- first, so no job is left half moved.

-- @include clock.lua
-- @include keys.lua
-- @include lease.lua
-- @include offload.lua
-- @include graph.lua
-- @include limits.lua
-- @include wake.lua
-- @include retention.lua
-- @include history.lua
-- @include order.lua

-- What only some completions need: a refusal's journal entry (lease.lua
-- refuse), and a run's hooks (an offload snapshot to settle, dependents to
-- tell, an order key to pass on, limits' wake-ups). Their helpers are made
-- by ends_lib() at the first such job of a call (E): each function a script
-- defines at its top is a closure made on every call, and the usual
-- completion needs none of these (benchmarks/README.md, "Session 22").
local E = nil
local function ends_lib()
  -- @lib (scripts.py prune: the helpers only this needs are made here)
  return {refuse = refuse, offload_settle = offload_settle, OFFLOAD_FIELDS = OFFLOAD_FIELDS,
    graph_finished = graph_finished, wake_workers = wake_workers, order_lib = order_lib,
    feature_keys = feature_keys, graph_queue_keys = graph_queue_keys, limits_lib = limits_lib,
    dedup_index_key = dedup_index_key, dedup_held_key = dedup_held_key}
end

-- The metrics history's flush (include history.lua), made only while the
-- queue's history is on: a lib of its own, so a queue with history does not
-- make the endings' helpers on every completion.
local function history_lib()
  -- @lib
  return history_flush
end

local now = now_ms(ARGV[1])
local now_s = str(now)
local prefix = ARGV[2]
local meta = redis.call('HMGET', KEYS[3], 'events', 'history')
events_open(KEYS[3], events_key(prefix), prefix, meta[1] or false)
history_counts = meta[2] == '1' and {} or nil
if type(redis.pcall('ZCARD', KEYS[1])) == 'table' then
  return redis.error_reply('VR_WRONGTYPE ' .. KEYS[1] .. ' is not a sorted set')
end
if type(redis.pcall('ZCARD', KEYS[2])) == 'table' then
  return redis.error_reply('VR_WRONGTYPE ' .. KEYS[2] .. ' is not a sorted set')
end
local n = tonumber(ARGV[5])
local out = {}
local seen = {}
local done, members = {}, {}
local kinds, runs = {}, {} -- the `completed` event's (events.lua emit_many)
local woke = 0
local fk, lim = nil, nil -- E.feature_keys(prefix) and E.limits_lib(), for the first run that held a slot
for i = 0, n - 1 do
  local a = 6 + i * 6
  local id, token = ARGV[a], ARGV[a + 1]
  local job_key, journal_key = job_keys(prefix, id)
  if seen[id] then
    out[i + 1] = 'job is completed'
  else
    seen[id] = true
    -- The lease check (lease.lua's check_owner, lean: what the usual run has).
    local f = redis.pcall('HMGET', job_key, 'state', 'lease_token', 'run_count', 'lease_owner',
      'claimed_at', 'hooks', 'kind')
    local refused = nil
    if f.err then
      refused = 'job key is not a hash'
    elseif not f[1] then
      refused = 'job does not exist'
    elseif f[1] ~= 'running' then
      E = E or ends_lib()
      refused = E.refuse(job_key, journal_key, f[1], 'job is ' .. f[1], f[3], 'complete', now_s)
    elseif f[2] ~= token then
      E = E or ends_lib()
      refused = E.refuse(job_key, journal_key, f[1],
        'lease token does not match (the lease expired and was reclaimed)', f[3], 'complete', now_s)
    end
    if refused then
      out[i + 1] = refused
    else
      local run = f[3]
      local note, attachment, carry, result = ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
      -- The job's first write: a journal of the wrong type refuses it here,
      -- with nothing written (the reclaim quarantines it at its lease's end).
      local first = run == '1' -- a first run starts the journal (journal_add compacts it)
      local entry
      if note == '' and attachment == '' and f[5] then
        -- The usual entry, its fields as arguments: journal_args's table
        -- (and with_claim's) would cost more than the XADD (journal_add).
        entry = journal_add(journal_key, first, 'event', 'completed', 'at', now_s, 'run', run,
          'worker', f[4] or '', 'claimed_at', f[5])
      else
        local args = journal_args(journal_key, now_s, 'completed', run, note, attachment,
          with_claim({}, f[4], f[5]))
        entry = journal_add(journal_key, first, unpack(args, 7))
      end
      if type(entry) == 'table' and entry.err then
        out[i + 1] = 'journal key is not a stream'
      else
        out[i + 1] = 1
        done[#done + 1] = id
        members[#members + 1] = now_s
        members[#members + 1] = id
        if events_stream then
          kinds[#done] = f[7] or ''
          runs[#done] = run
        end
        if history_counts then
          -- The run's time: from its claim to now, on the clock of both.
          local kind = f[7] or ''
          local field = kind .. '\tcompleted'
          history_counts[field] = (history_counts[field] or 0) + 1
          local claimed = tonumber(f[5])
          if claimed and claimed <= now then
            field = kind .. '\trun_ms'
            history_counts[field] = (history_counts[field] or 0) + now - claimed
          end
        end
        -- No updated_at: a completed job's last change is its finished_at
        -- (records.py reads the latest of the three).
        -- The lease fields and an empty note are removed, not emptied (a
        -- field costs each retained hash ~15 B). A first run has no
        -- attachment or result of an earlier run to drop (a note it may have:
        -- an operator's retry of a job that died unstarted): the usual
        -- completion is one HSET and one HDEL.
        if note == '' then
          redis.call('HSET', job_key, 'state', 'completed', 'finished_at', now_s)
        else
          redis.call('HSET', job_key, 'state', 'completed', 'note', note,
            'finished_at', now_s)
        end
        if attachment == '' and result == '' then
          if first and note ~= '' then
            redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'claimed_at')
          elseif first then
            -- `note` too: a first run may follow an operator's retry of a job
            -- that died unstarted ("retried by an operator").
            redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'claimed_at', 'note')
          elseif note == '' then
            redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'claimed_at', 'note',
              'attachment', 'result')
          else
            redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'claimed_at', 'attachment',
              'result')
          end
        else
          -- lease.lua's clear_lease and set_blob, inline: a result is no
          -- reason to make the lib above.
          if note == '' then
            redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'claimed_at', 'note')
          else
            redis.call('HDEL', job_key, 'lease_token', 'lease_expires', 'claimed_at')
          end
          if attachment == '' then
            redis.call('HDEL', job_key, 'attachment')
          else
            redis.call('HSET', job_key, 'attachment', attachment)
          end
          if result == '' then
            redis.call('HDEL', job_key, 'result')
          else
            redis.call('HSET', job_key, 'result', result)
          end
        end
        if carry ~= '' then redis.call('HSET', job_key, 'carry', carry) end
        -- A slot, an offload, dependents (lease.lua, `hooks`); a run claimed
        -- before 0.2 (no claimed_at) may have any of them without the flag.
        if f[6] or not f[5] then
          E = E or ends_lib()
          local x = redis.call('HMGET', job_key, 'slot', E.OFFLOAD_FIELDS[1], E.OFFLOAD_FIELDS[2], 'dependents',
            'dedup_window', 'dedup', 'order_key')
          if x[5] and x[6] and redis.pcall('HGET', E.dedup_index_key(prefix), x[6]) == id then
            -- Throttled (docs/dedup.md): the key stays held by this job until
            -- the window's end, on this script's clock. In pcalls: an index
            -- or held set of the wrong type ends the window now, it does
            -- not stop the completion half written.
            local until_s = str(now + (tonumber(x[5]) or 0))
            if type(redis.pcall('ZADD', E.dedup_held_key(prefix), until_s, x[6])) == 'number' then
              redis.call('HSET', job_key, 'dedup_until', until_s)
            end
          end
          E.offload_settle(prefix, job_key, id, 'completed', result, nil, now, {x[2], x[3]})
          if x[4] then
            E.graph_finished(prefix, x[4], job_key, id, now, true, result, nil)
          end
          if x[1] then
            lim = lim or E.limits_lib()
            fk = fk or E.feature_keys(prefix)
            if lim.release(fk.limits_state, fk.limits_ready, job_key, x[1], now_s) then woke = woke + 1 end
          end
          -- Its order key goes to the key's next job (order.lua).
          if x[7] then
            E.order_lib(E.feature_keys, E.graph_queue_keys, job_keys).release(prefix, job_key, x[7], id, nil)
          end
        end
      end
    end
  end
end
if #done == 0 then
  return out
end
redis.call('ZREM', KEYS[1], unpack(done))
redis.call('ZADD', KEYS[2], unpack(members))
if events_stream then
  emit_many('completed', now_s, done, kinds, runs)
end
trim_finished(prefix, KEYS[2], now, ARGV[3], ARGV[4], #done)
if history_counts then history_lib()(prefix, now) end
if woke > 0 then
  E = E or ends_lib()
  E.wake_workers(E.feature_keys(prefix).wake, woke)
end
return out
