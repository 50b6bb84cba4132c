-- The queue's event stream, venturi:{q}:events (docs/observability.md): every
-- transition of the queue's jobs is appended there by the script that makes
-- it, in the same atomic step, so events and journals never disagree. On by
-- default.
--
-- The switch is the queue meta hash's field `events`: absent = EVENTS_DEFAULT
-- (on, the stream capped at about that many entries), '0' = off, N = on,
-- capped at about N entries (XADD MAXLEN ~ N). A value that is not a whole
-- number a MAXLEN can take (an operator's `HSET ... events x`, or 10^20) is
-- the default: it never reaches XADD, so it can never fail a transition half
-- way (issue 38). The stream is made by the first event after it is deleted
-- (a DEL is not a switch: `HSET <meta> events 0` is).
--
-- Entries, two forms (the client reads both, _model/events.py):
-- * one job: event, job (id), kind, at (ms), run, then note when there is
--   one, then the journal entry's own extra fields (worker, failures, reason...;
--   a failure's traceback stays in the journal);
-- * many jobs of one script call (an enqueue of many, a claim, a batch of
--   completions): event, at, n, jobs (the ids, space-separated), kind (when
--   they all share one) or kinds (one per job, newline-separated: a KIND is
--   printable, so it holds no newline), and runs (space-separated) unless
--   every run is the same, then run, then note when the jobs share one (an
--   operator's retry of many), then the fields every job of the entry
--   shares (a claim's worker). One XADD per call instead of one per job: a
--   batch of 100 completions costs the stream one entry, not 100.
--
-- Every script that journals reads the switch with `events_open` at its top
-- (claim and complete together with their other meta fields); a script that
-- does not (a new one not wired yet) emits nothing.
--
-- An event is the last write of its script and never fails it: the XADD runs
-- in a pcall, and a stream key of the wrong type (made by hand) loses that
-- event, with a WARNING in the Redis server's log, while the transition
-- stands (issue 38 item 6: an enqueue that raised after writing its job made
-- a caller's retry a duplicate). Each XADD's reply goes to `events_checked`.

-- @include clock.lua
-- @include keys.lua

-- (tests/test_events.py checks this is _store/calls_obs.py's EVENTS_DEFAULT.)
local EVENTS_DEFAULT = '1000'
-- This call's stream while events are on (nil: off, or events_open not called).
local events_stream = nil
-- The cap of this call's XADDs (MAXLEN ~), set by events_open.
local events_cap = nil

-- Read the switch (once per call, at the top of every script that journals):
-- the queue's meta hash and event stream from the caller's KEYS, its key
-- prefix (ARGV[2]). `field`: the meta hash's `events` field when the caller
-- read it anyway (claim.lua, complete.lua); false/nil = absent.
local function events_open(meta_key, stream_key, prefix, field)
  local v = field
  if v == nil then v = redis.call('HGET', meta_key, 'events') end
  if not v then
    -- The usual queue: on, at the default cap, and nothing to check (a
    -- string.match and two tonumber calls are ~3,000 instructions a call).
    events_stream = stream_key
    events_cap = EVENTS_DEFAULT
    return
  end
  if v == '0' then return end
  -- A whole number from 1 to 10^9 (the API's bound, _model/limits.py
  -- MAX_COUNT); anything else is the default.
  if #v > 10 or not string.match(v, '^%d+$') or tonumber(v) > 1000000000 then v = EVENTS_DEFAULT end
  if tonumber(v) == 0 then return end
  events_stream = stream_key
  events_cap = v
end

-- The reply of an event's `redis.pcall('XADD', ...)`: a refusal (the key is
-- not a stream) is logged and dropped.
local function events_checked(r)
  if type(r) == 'table' and r.err and redis.log then
    redis.log(redis.LOG_WARNING, 'venturi: event not written to ' .. events_stream .. ': ' .. tostring(r.err))
  end
end

-- Append one job's event; `extra` a flat list of field, value pairs. The
-- caller checks `events_stream` first (the off path builds nothing).
local function emit(id, kind, event, at, run, note, extra)
  local args = {'XADD', events_stream, 'MAXLEN', '~', events_cap, '*',
                'event', event, 'job', id, 'kind', kind or '', 'at', str(at), 'run', str(run or 0)}
  if note ~= nil and note ~= false and note ~= '' then
    args[#args + 1] = 'note'
    args[#args + 1] = note
  end
  if extra then
    -- A failure's traceback (up to 2 KB) stays in the journal: an event
    -- keeps the stream small and says where to look (error_type, the job).
    for i = 1, #extra, 2 do
      if extra[i] ~= 'traceback' then
        args[#args + 1] = extra[i]
        args[#args + 1] = extra[i + 1]
      end
    end
  end
  events_checked(redis.pcall(unpack(args)))
end

-- Append one entry for the jobs `ids` (with their `kinds` and `runs`, lists
-- of the same length) that took `event` at `at` in this call: the one-job
-- form for one job, else the many-jobs form (see the top of this file).
-- `extra`: field, value pairs every job of the entry shares (a claim's worker);
-- `note`: the note they share (optional: nil or '' is none).
local function emit_many(event, at, ids, kinds, runs, extra, note)
  local n = #ids
  if n == 0 then return end
  if n == 1 then
    emit(ids[1], kinds[1], event, at, runs[1], note, extra)
    return
  end
  local args = {'XADD', events_stream, 'MAXLEN', '~', events_cap, '*',
                'event', event, 'at', str(at), 'n', str(n), 'jobs', table.concat(ids, ' ')}
  local kind, run = kinds[1], runs[1]
  local same_kind, same_run = true, true
  for i = 2, n do
    if kinds[i] ~= kind then same_kind = false end
    if runs[i] ~= run then same_run = false end
  end
  args[#args + 1] = same_kind and 'kind' or 'kinds'
  args[#args + 1] = same_kind and kind or table.concat(kinds, '\n')
  args[#args + 1] = same_run and 'run' or 'runs'
  args[#args + 1] = same_run and str(run) or table.concat(runs, ' ')
  if note ~= nil and note ~= false and note ~= '' then
    args[#args + 1] = 'note'
    args[#args + 1] = note
  end
  if extra then
    for i = 1, #extra do args[#args + 1] = extra[i] end
  end
  events_checked(redis.pcall(unpack(args)))
end
