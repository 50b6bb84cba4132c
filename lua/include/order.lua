-- Ordered keys (docs/semantics.md "Ordered keys", docs/redis-layout.md):
-- jobs of one queue with the same order key run one at a time, in enqueue
-- order. The key's holder (`order:held`) is the one of its jobs that may be
-- pending, running, retrying or suspended; the others wait in `order:queue`
-- (pending, their hash's `ordered` field naming their member there), in no
-- pending set, so the claim never sees them and pays nothing for them. When
-- the holder finishes for good (completed, dead, cancelled), the next job of
-- its key becomes the holder and goes to its pending set. A job with an
-- order key carries the `hooks` flag (lease.lua) from its enqueue: the
-- scripts that end a run read its `order_key` only then.

-- @include keys.lua

-- Everything is made by order_lib(), called only on the path of a job with
-- an order key: each top-level `local function` is a closure made on every
-- call of the script (limits.lua says so too), so a script that includes
-- this pays for one closure while its jobs have no order key. It takes
-- keys.lua's three helpers it needs as arguments, so that closure captures
-- no upvalue: capturing one of a script's top-level functions walks the
-- list of its open upvalues, every call (callgrind: ~+0.5% on claim +
-- complete at batch 1 for three of them). Call it as
-- order_lib(feature_keys, graph_queue_keys, job_keys). It returns the
-- helpers in a table: keys, broken, arrive, next, release, ended, SEP.
local function order_lib(feature_keys, graph_queue_keys, job_keys)
  -- The order keys of the queue at `prefix` (keys.lua feature_keys), with
  -- the pending sets by priority label and the wake list, for order_next.
  local function order_keys(prefix)
    local f = feature_keys(prefix)
    return {held = f.order_held, queue = f.order_queue, paused = f.order_paused, seq = f.order_seq,
      wake = f.wake, pending = graph_queue_keys(prefix).pending}
  end

  -- The byte between an order key and its sequence number in `order:queue`
  -- (never in UTF-8, so one key's members are exactly [key SEP, key SEP SEP).
  local SEP = '\255'

  -- What is wrong with one of the order keys `ok` (order_keys above),
  -- or nil: checked before the first write of a script that moves them. A
  -- damaged key stops only the ordered jobs (their key stays held: repair
  -- it, then queue.resume_key), never the others, which never read it.
  local function order_broken(ok)
    if type(redis.pcall('HLEN', ok.held)) == 'table' then return ok.held .. ' is not a hash' end
    if type(redis.pcall('ZCARD', ok.queue)) == 'table' then return ok.queue .. ' is not a sorted set' end
    if type(redis.pcall('SCARD', ok.paused)) == 'table' then return ok.paused .. ' is not a set' end
    local seq = redis.pcall('GET', ok.seq)
    if type(seq) == 'table' or (seq and not string.match(seq, '^%d+$')) then
      return ok.seq .. ' is not a counter'
    end
    return nil
  end

  -- A new job `id` of order key `okey` (its keys checked: order_broken;
  -- enqueue.lua has its own copy, inline):
  -- it holds the key when the key is free and not paused (then '': the
  -- caller puts it in its pending set as usual), else it waits at the end
  -- of the key's queue: returns its member there (the caller stores it as
  -- `ordered`).
  local function order_arrive(ok, okey, id)
    if not redis.call('HGET', ok.held, okey) and redis.call('SISMEMBER', ok.paused, okey) == 0 then
      redis.call('HSET', ok.held, okey, id)
      return ''
    end
    local member = okey .. SEP .. string.format('%016d', redis.call('INCR', ok.seq)) .. id
    redis.call('ZADD', ok.queue, 0, member)
    return member
  end

  -- Give the free key `okey` to its first waiting job: it holds the key and
  -- goes to its pending set (a priority naming none goes to normal's, where
  -- the claim quarantines it), and a worker is woken. An entry whose job is
  -- no longer waiting on it (deleted by hand) is dropped on the way. A
  -- pending set or wake list of the wrong type stops it before any write:
  -- the key stays with its finished holder (queue.resume_key, once it is
  -- repaired, lets the next go), and the script's other work goes on.
  -- Returns 1 when a job was let go, 0 when none was.
  local function order_next(prefix, ok, okey)
    while true do
      local m = redis.call('ZRANGEBYLEX', ok.queue, '[' .. okey .. SEP, '(' .. okey .. SEP .. SEP,
        'LIMIT', 0, 1)
      if #m == 0 then
        redis.call('HDEL', ok.held, okey)
        return 0
      end
      local nid = string.sub(m[1], #okey + 18)
      local job_key = job_keys(prefix, nid)
      local f = redis.pcall('HMGET', job_key, 'state', 'ordered', 'priority', 'eligible_at')
      if not f.err and f[1] == 'pending' and f[2] == m[1] then
        local set = ok.pending[f[3] or ''] or ok.pending.normal
        if type(redis.pcall('ZCARD', set)) == 'table' or type(redis.pcall('LLEN', ok.wake)) == 'table' then
          return 0
        end
        redis.call('ZREM', ok.queue, m[1])
        redis.call('HDEL', job_key, 'ordered')
        redis.call('HSET', ok.held, okey, nid)
        redis.call('ZADD', set, tonumber(f[4]) or 0, nid)
        -- wake.lua's wake_workers for one job, inline (the claim has no other use for it).
        if redis.call('RPUSH', ok.wake, '1') > 1024 then redis.call('LTRIM', ok.wake, -1024, -1) end
        return 1
      end
      redis.call('ZREM', ok.queue, m[1])
    end
  end

  -- Job `id` (hash `job_key`) of order key `okey` finished for good
  -- (completed, dead, cancelled): waiting on its key (`member`, its
  -- `ordered` field), it leaves the key's queue; holding it, it lets the
  -- next job go (order_next), or, the key being paused, leaves it free for
  -- queue.resume_key. Nothing for a job that holds nothing.
  local function order_release(prefix, job_key, okey, id, member)
    local ok = order_keys(prefix)
    if order_broken(ok) then return end
    if member then
      redis.call('ZREM', ok.queue, member)
      redis.call('HDEL', job_key, 'ordered')
    elseif redis.call('HGET', ok.held, okey) == id then
      if redis.call('SISMEMBER', ok.paused, okey) == 1 then
        redis.call('HDEL', ok.held, okey)
      else
        order_next(prefix, ok, okey)
      end
    end
  end

  -- A job ended by a path that has not read its order fields (the claim's
  -- cancel, expiry and quarantine endings): read and released here.
  local function order_ended(prefix, job_key, id)
    local f = redis.pcall('HMGET', job_key, 'order_key', 'ordered')
    if not f.err and f[1] then
      order_release(prefix, job_key, f[1], id, f[2] or nil)
    end
  end

  return {
    keys = order_keys, broken = order_broken, arrive = order_arrive, next = order_next, release = order_release,
    ended = order_ended, SEP = SEP,
  }
end
