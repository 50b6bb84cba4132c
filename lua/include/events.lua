-- The queue's event stream, venturi:{q}:events (docs/observability.md): the
-- journal entry of every job's transition is also appended there, by the
-- same script (journal.lua's `journal` calls `emit_journaled`), so events
-- and journals never disagree. enqueue.lua emits `enqueued` itself (it writes no journal)
-- and progress.lua emits `progress` (a value, not a transition: not journaled).
--
-- The switch is the queue meta hash's field `events`: absent = EVENTS_DEFAULT,
-- '0' = off, N = on, the stream capped at about N entries (XADD MAXLEN ~ N);
-- and the stream must exist: events are appended with NOMKSTREAM, so a stream
-- deleted by hand stays deleted (events stop) until it is switched on again,
-- which writes an `events_on` entry (queue.set_events, venturi queue events,
-- or the redis-cli recipe of docs/redis-layout.md). enqueue.lua relies on it:
-- it learns whether the stream exists from the EXISTS it makes anyway and
-- reads the switch only when it does.
-- Every script that journals takes the meta hash and the stream in KEYS and
-- reads the switch with `events_open` at its top; a script that does not (a
-- new one not wired yet) emits nothing.
--
-- Entry fields: event, job (id), kind, at (ms), run, then note when there is
-- one, then the journal entry's own extra fields (worker, failures, reason...).

-- @include clock.lua
-- @include keys.lua

-- (tests/test_events.py checks this is _store/calls_obs.py's EVENTS_DEFAULT.)
local EVENTS_DEFAULT = '0'
-- This call's stream while events are on (nil: off, or events_open not called).
local events_stream = nil
-- emit(id, kind, event, at, run, note, extra): append one event; `extra` a flat
-- list of field, value pairs. Made by events_open when the queue's events are
-- on, else nil: Redis runs a script's whole body on every call, and each
-- function it defines is a closure made and collected per call, so the off
-- path defines none but events_open (benchmarks/redis_cost.py). A journal
-- entry's event is emitted by journal.lua's `journal` itself: here, it would
-- make every events_open (enqueue's too) carry keys.lua's job_keys, and each
-- upvalue and closure is paid per call (~3,600 instructions per enqueue).
local emit = nil

-- Read the switch (once per call, at the top of every script that journals):
-- the queue's meta hash and event stream from the caller's KEYS, its key
-- prefix (ARGV[2]). `field`: the meta hash's `events` field when the caller
-- read it anyway (claim.lua, with `paused`); false/nil = absent.
-- The off path is kept to one HGET and a comparison: it runs on every call.
local function events_open(meta_key, stream_key, prefix, field)
  local v = field
  if v == nil then v = redis.call('HGET', meta_key, 'events') end
  if not v then v = EVENTS_DEFAULT end
  if v == '0' then return end
  -- An operator's field that is not a number is the default: it never
  -- reaches XADD unchecked.
  if not string.match(v, '^%d+$') then
    v = EVENTS_DEFAULT
    if v == '0' then return end
  end
  local cap = v
  events_stream = stream_key
  emit = function(id, kind, event, at, run, note, extra)
    local args = {'XADD', stream_key, 'NOMKSTREAM', 'MAXLEN', '~', cap, '*',
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
    redis.call(unpack(args))
  end
end
