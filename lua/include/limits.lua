-- Flow control (docs/flow-control.md): concurrency and rate limits per kind
-- and per limit key, enforced when a job is claimed, fair across keys.
--
-- Four keys, all passed in KEYS by the scripts that use them
-- (docs/redis-layout.md, "Flow control"):
--   limits        hash  kind -> 'KC KN KP PC PN PP': the kind-wide concurrency,
--                       rate count and rate period in ms, then the same per
--                       key (0 = no such cap). Written by limit.lua only.
--   limits:state  hash  running counts: field <kind> (kind-wide), field
--                       <entity> (per key), field <kind>\t+ (all its keys
--                       together); rate rings: <base>\t#<count>:<i>
--                       (the start times of the last <count> runs) and
--                       <base>\t#<count>p (the ring's next slot); the flag
--                       <kind>\t! (some key waits on the kind-wide cap).
--   limits:parked zset  every score 0, so ordered by member: <entity>\t<level><id>
--                       (level 0..3, CRITICAL first): the jobs of limited
--                       kinds waiting for their turn, by key, then priority,
--                       then id (creation order).
--   limits:ready  zset  the entities with parked jobs, scored by when they may
--                       be claimed (ms): now, the end of a rate window,
--                       LIMIT_HELD + n (waiting on the kind-wide cap, in the
--                       order they came: each slot freed readies the first)
--                       or LIMIT_BLOCKED (waiting on its key's own cap: the
--                       script that frees its slot scores it now again).
-- An entity is <kind>\t<limit_key field> (keys.py limit_field: length-
-- prefixed, so no key names another's entries; '' for a job without a key).
-- A KIND is printable, so it holds no tab.
-- A running job that took a slot has the field `slot` ('k' kind-wide, 'p'
-- per key, 'kp' both); the script that ends its run gives the slots back.

-- @include clock.lua

-- Everything is made by limits_lib(), called by a script only on the path
-- that needs it (a limited claim, a run holding a slot): Redis runs a
-- script's whole body on every call and each top-level `local function` is a
-- closure made per call, so a queue without limits pays for one closure, not
-- a dozen (benchmarks/redis_cost.py). It returns the helpers in a table:
-- entity, config, park, unpark, check, take, hold, wake_held, release, and
-- the constants HELD (LIMIT_HELD) and LEVEL (LIMIT_LEVEL).
local function limits_lib()
  local LIMIT_BLOCKED = 9007199254740000
  local LIMIT_BLOCKED_S = '9007199254740000'
  -- 2^52 + a sequence: waiting on its kind's kind-wide cap, first come first
  -- served (limit_hold, limit_wake_held). Below LIMIT_BLOCKED, far above any time.
  local LIMIT_HELD = 4503599627370496
  local LIMIT_HELD_S = '4503599627370496'
  local LIMIT_LEVEL = {critical = '0', high = '1', normal = '2', low = '3'}

  local function limit_entity(kind, key)
    if key == nil or key == false then
      return kind .. '\t'
    end
    return kind .. '\t' .. key
  end

  -- The config of a kind: {KC, KN, KP, PC, PN, PP}, all 0 for none. A value
  -- edited by hand that is no whole number of at most 15 digits (`abc`,
  -- `-5`, `0.5`, `1e400`) is no such cap, as a missing one is: a cap the
  -- scripts cannot count with would fail every claim of the kind
  -- (_producer/limits.py reads it the same way).
  local function limit_config(raw)
    local c = {0, 0, 0, 0, 0, 0}
    if raw then
      local i = 0
      for v in string.gmatch(raw, '%S+') do
        i = i + 1
        c[i] = (#v <= 15 and string.match(v, '^%d+$')) and tonumber(v) or 0
      end
    end
    return c
  end

  -- Add `by` to a count of limits:state (a kind's or a key's running runs, the
  -- hold sequence) and return it. A count edited by hand into one HINCRBY
  -- refuses (`abc`, `0.5`) is counted again from 0, written whole: the claim
  -- that takes a slot and the script that gives it back never fail half way
  -- on it (before, every claim of the kind stranded its job in running).
  local function limit_add(state_key, field, by)
    local n = redis.pcall('HINCRBY', state_key, field, by)
    if type(n) == 'table' and n.err then
      n = by > 0 and by or 0
      -- (A key of the wrong type, not a count, fails here with its own error.)
      redis.call('HSET', state_key, field, str(n))
    end
    return n
  end

  -- Park a pending job of a limited kind: out of the pending sets (the caller
  -- has taken it out, or never put it in), into the parked set under its
  -- entity, which joins the ready rotation (NX: a waiting entity keeps its score).
  local function limit_park(parked_key, ready_key, job_key, entity, priority, id, now_s)
    local member = entity .. '\t' .. (LIMIT_LEVEL[priority or ''] or '2') .. id
    redis.call('ZADD', parked_key, 0, member)
    redis.call('ZADD', ready_key, 'NX', now_s, entity)
    redis.call('HSET', job_key, 'parked', member)
    return member
  end

  -- A parked job leaving pending another way (cancelled, merged to another
  -- priority): out of the parked set. An entity left with no parked job is
  -- dropped from the rotation by the next claim that reaches it.
  local function limit_unpark(parked_key, member)
    if member and member ~= '' then
      redis.call('ZREM', parked_key, member)
    end
  end

  -- A rate ring of `count` start times: nil (a start is allowed; the slot to
  -- write is returned second) or the time in ms the window rolls.
  local function limit_ring(state_key, base, count, per, now)
    local head = base .. '\t#' .. str(count)
    local p = redis.call('HGET', state_key, head .. 'p') or '0'
    -- A slot that is not one of the ring's (edited by hand): the ring's first.
    if #p > 15 or not string.match(p, '^%d+$') or tonumber(p) >= count then
      p = '0'
    end
    local old = tonumber(redis.call('HGET', state_key, head .. ':' .. p))
    if old and now - old < per then
      return old + per, p
    end
    return nil, p
  end

  local function limit_ring_write(state_key, base, count, p, now_s)
    local head = base .. '\t#' .. str(count)
    redis.call('HSET', state_key, head .. ':' .. p, now_s, head .. 'p', str((tonumber(p) + 1) % count))
  end

  -- May a job of `entity` start now? Returns true and the rings' slots, or
  -- false and the score its entity waits at in the ready set: 'hold' (the
  -- kind-wide cap: limit_hold), LIMIT_BLOCKED (its key's cap) or when a rate
  -- window rolls; a third value true when the key's own limit refused it
  -- (the kind had room).
  local function limit_check(state_key, cfg, kind, entity, keyed, now)
    if cfg[1] > 0 and (tonumber(redis.call('HGET', state_key, kind)) or 0) >= cfg[1] then
      return false, 'hold'
    end
    local kp, ep = nil, nil
    if cfg[2] > 0 then
      local t
      t, kp = limit_ring(state_key, kind, cfg[2], cfg[3], now)
      if t then return false, t end
    end
    if keyed then
      if cfg[4] > 0 and (tonumber(redis.call('HGET', state_key, entity)) or 0) >= cfg[4] then
        return false, LIMIT_BLOCKED, true
      end
      if cfg[5] > 0 then
        local t
        t, ep = limit_ring(state_key, entity, cfg[5], cfg[6], now)
        if t then return false, t, true end
      end
    end
    return true, kp, ep
  end

  -- Count the start of a run allowed by limit_check. Returns the job's `slot`
  -- field ('' when it holds no concurrency slot).
  local function limit_take(state_key, cfg, kind, entity, keyed, kp, ep, now_s)
    local slot = ''
    if cfg[1] > 0 then
      limit_add(state_key, kind, 1)
      slot = 'k'
    end
    if kp then limit_ring_write(state_key, kind, cfg[2], kp, now_s) end
    if keyed then
      if cfg[4] > 0 then
        limit_add(state_key, entity, 1)
        limit_add(state_key, kind .. '\t+', 1) -- all its keys together (queue.limits())
        slot = slot .. 'p'
      end
      if ep then limit_ring_write(state_key, entity, cfg[5], ep, now_s) end
    end
    return slot
  end

  -- An entity waits on its kind-wide cap: behind the ones already waiting.
  local function limit_hold(state_key, ready_key, entity, kind)
    local seq = limit_add(state_key, '\tseq', 1)
    redis.call('ZADD', ready_key, str(LIMIT_HELD + seq), entity)
    redis.call('HSET', state_key, kind .. '\t!', '1')
  end

  -- A slot of `kind` is free (or the entity readied for it could not use
  -- it): the entity of that kind waiting longest on the kind-wide cap is
  -- ready. Returns true when there was one; with none, the kind's flag goes.
  local function limit_wake_held(state_key, ready_key, kind, now_s)
    if redis.call('HEXISTS', state_key, kind .. '\t!') == 0 then
      return false
    end
    local head = kind .. '\t'
    local offset = 0
    while true do
      local page = redis.call('ZRANGEBYSCORE', ready_key, LIMIT_HELD_S, '(' .. LIMIT_BLOCKED_S,
        'LIMIT', offset, 100)
      for _, e in ipairs(page) do
        if string.sub(e, 1, #head) == head then
          redis.call('ZADD', ready_key, now_s, e)
          return true
        end
      end
      if #page < 100 then break end
      offset = offset + #page
    end
    redis.call('HDEL', state_key, kind .. '\t!')
    return false
  end

  local function limit_decr(state_key, field)
    if limit_add(state_key, field, -1) <= 0 then
      redis.call('HDEL', state_key, field)
    end
  end

  -- A run that held slots ends (complete, retry, dead, pause, suspend, cancel,
  -- release, reclaim): its slots go back, and the entities waiting on them are
  -- ready again. Returns true when some entity was made ready (the caller
  -- wakes a worker).
  local function limit_release(state_key, ready_key, job_key, slot, now_s)
    local f = redis.call('HMGET', job_key, 'kind', 'limit_key')
    redis.call('HDEL', job_key, 'slot')
    local kind = f[1]
    if not kind then return false end
    local woke = false
    if string.find(slot, 'k', 1, true) then
      limit_decr(state_key, kind)
      if limit_wake_held(state_key, ready_key, kind, now_s) then woke = true end
    end
    if string.find(slot, 'p', 1, true) then
      local entity = limit_entity(kind, f[2])
      limit_decr(state_key, entity)
      limit_decr(state_key, kind .. '\t+')
      if tonumber(redis.call('ZSCORE', ready_key, entity)) == LIMIT_BLOCKED then
        redis.call('ZADD', ready_key, now_s, entity)
        woke = true
      end
    end
    return woke
  end

  -- A key's rate ring outlives its last parked job only while its window is
  -- open: without this, every limit key a per-key rate ever counted kept its
  -- ring's fields in limits:state for good (count + 1 fields a key: a queue
  -- limiting a million customers kept a million rings). Drop the ring of
  -- `head` (`<entity>\t#<count>`): the slots written (all of them once the
  -- ring wrapped, else those below its next slot) and the next-slot field.
  local function limit_drop_ring(state_key, head, count)
    local p = tonumber(redis.call('HGET', state_key, head .. 'p') or '') or 0
    local last = count - 1
    if p >= count or redis.call('HEXISTS', state_key, head .. ':' .. str(last)) == 0 then
      last = math.min(p, count) - 1
    end
    local names = {head .. 'p'}
    for i = 0, last do
      names[#names + 1] = head .. ':' .. str(i)
      if #names == 500 then
        redis.call('HDEL', state_key, unpack(names))
        names = {}
      end
    end
    if #names > 0 then redis.call('HDEL', state_key, unpack(names)) end
  end

  -- The claim found no job parked under `entity` (it leaves the ready
  -- rotation) whose per-key rate is `count` per `per` ms: its ring goes now
  -- when its newest start is a window old, else `limits:rings` holds it until
  -- then (scored by when its window closes), for the reclaim's sweep.
  local function limit_rest(state_key, rings_key, entity, count, per, now)
    local head = entity .. '\t#' .. str(count)
    local p = tonumber(redis.call('HGET', state_key, head .. 'p') or '')
    if not p then return end -- the ring was never written
    local newest = tonumber(redis.call('HGET', state_key, head .. ':' .. str((p - 1) % count)))
    if newest and now - newest < per then
      redis.call('ZADD', rings_key, str(newest + per), head)
    else
      limit_drop_ring(state_key, head, count)
    end
  end

  -- The reclaim's sweep: the rings whose window has closed since their key
  -- left the rotation go, unless the key has jobs parked again (it is back
  -- in limits:ready: the claim files it here again when it leaves). Bounded
  -- per call; returns true when it stopped at its cap.
  local function limit_sweep_rings(state_key, ready_key, rings_key, now)
    local due = redis.pcall('ZRANGEBYSCORE', rings_key, '-inf', str(now), 'LIMIT', 0, 100)
    if type(due) ~= 'table' or due.err or #due == 0 then return false end
    for _, head in ipairs(due) do
      local entity, count = string.match(head, '^(.*)\t#(%d+)$')
      local parked = entity and redis.pcall('ZSCORE', ready_key, entity)
      if entity and #count <= 15 and not parked then
        limit_drop_ring(state_key, head, tonumber(count))
      end
    end
    redis.call('ZREM', rings_key, unpack(due))
    return #due == 100
  end

  return {
    entity = limit_entity, config = limit_config, park = limit_park, unpark = limit_unpark,
    check = limit_check, take = limit_take, hold = limit_hold, wake_held = limit_wake_held,
    release = limit_release, rest = limit_rest, sweep_rings = limit_sweep_rings,
    HELD = LIMIT_HELD, LEVEL = LIMIT_LEVEL,
  }
end
