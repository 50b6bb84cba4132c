"""Schedules: when a schedule fires (cron or a fixed interval, in a time zone), and what it is.

Pure computation over milliseconds since the epoch (the unit of every stored
time), so the producer, the worker and the tests agree on each fire time.
Cron expressions are parsed and stepped by ``cronsim`` (the ``schedules``
extra); time zones are the standard ``zoneinfo`` (``tzdata`` where the system
has no zone files). Nothing here talks to Redis: ``_producer/schedules.py``
stores schedules and ``lua/schedule_fire.lua`` fires them.

Daylight-saving time (docs/schedules.md): a cron expression is read in the
schedule's zone as Debian's cron does (cronsim's rules). A fire time that a
spring-forward skips fires once, at the first minute after the gap (02:30 on a
night whose clock jumps from 02:00 to 03:00 fires at 03:00); a fire time that a
fall-back repeats fires once, at its first occurrence, unless the expression
names every hour (``0 * * * *`` fires each real hour, both 02:00s included).
``every`` is an interval of real time, its zone irrelevant.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .backoff import MAX_SECONDS, to_ms
from .enums import Priority
from .errors import ConfigurationError, TaskDefinitionError
from .task import Task

# The usual shorthands (crontab(5)); anything else is the 5-field expression itself.
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# A catch-up counts the fire times it stands for up to this many; past it the
# count says "at least" (a one-minute cron down for a week would step 10,080 times).
MAX_COUNTED = 10_000
_SEARCH_STEPS = 100_000  # fire times stepped over before a start_at is given up on
# The last instant a datetime can name (9999-12-31T23:59:59.999Z): no fire time
# after it (the schedule has ended), and no start_at or end_at.
MAX_MS = 253_402_300_799_999


def _has_cronsim() -> bool:
    try:
        import cronsim  # noqa: F401
    except ImportError:  # pragma: no cover - the extra is in dev
        return False
    return True


def _cronsim() -> Any:
    try:
        import cronsim
    except ImportError:  # pragma: no cover - the extra is in dev
        raise ConfigurationError(
            "cron schedules need the cronsim package: pip install 'venturi-redis[schedules]'"
        ) from None
    return cronsim


# Names the zone database answers to that are no one zone: `localtime` is each
# host's own (a schedule would fire at a different instant on each worker),
# `Factory` and `posixrules` are placeholders, and `posix/...`, `right/...` are
# copies of the database (`right/` counting leap seconds) beside the IANA names.
_NOT_A_ZONE = frozenset({"localtime", "factory", "posixrules"})


def _zone(tz: object) -> zoneinfo.ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise ConfigurationError(f"tz must be an IANA time zone name such as 'Europe/Berlin', got {tz!r}")
    if tz.lower() in _NOT_A_ZONE or tz.startswith(("posix/", "right/")):
        raise ConfigurationError(
            f"tz {tz!r} is not one IANA zone ('localtime' is each host's own): "
            "name the zone, such as 'Europe/Berlin' or 'UTC'"
        )
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"unknown time zone {tz!r}: use an IANA name such as 'Europe/Berlin' "
            "(install tzdata where the system has no zone files)"
        ) from None


def _when_ms(value: object, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ConfigurationError(f"{what} must be a timezone-aware datetime or None, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ConfigurationError(
            f"{what} must be timezone-aware (a naive datetime has no instant), got {value!r}"
        )
    try:
        ms = int(value.timestamp() * 1000)
    except (OverflowError, ValueError):  # past year 9999 in UTC
        ms = MAX_MS + 1
    # Stored times are ms since 1970 (a score, a field the scripts read as digits),
    # and each must read back as a datetime.
    if not 0 <= ms <= MAX_MS:
        raise ConfigurationError(f"{what} must be from 1970-01-01 to 9999-12-31 UTC, got {value.isoformat()}")
    return ms


def ms_dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


@dataclass(frozen=True, slots=True)
class Timing:
    """When a schedule fires: exactly one of ``cron`` and ``every_ms``, in zone ``tz``.

    ``start_ms`` / ``end_ms``: no fire time before / after them (None: unbounded).
    """

    cron: str | None
    every_ms: int | None
    tz: str
    start_ms: int | None
    end_ms: int | None

    @property
    def kind(self) -> str:
        return "cron" if self.cron is not None else "every"

    def fingerprint(self) -> str:
        """What the stored next fire time depends on: a change recomputes it, anything else keeps it."""
        return "|".join(
            "" if v is None else str(v)
            for v in (self.cron, self.every_ms, self.tz, self.start_ms, self.end_ms)
        )

    def first_anchor(self, now_ms: int) -> int:
        """An interval schedule's first fire time: ``start_at``, else one interval from now."""
        if self.every_ms is None:
            return self.start_ms or 0
        return self.start_ms if self.start_ms is not None else now_ms + self.every_ms

    def next_after(self, t_ms: int, anchor_ms: int) -> int | None:
        """The first fire time strictly after ``t_ms`` (None: the schedule has ended).

        ``anchor_ms``: an interval schedule's first fire time (its fire times are
        ``anchor + k * every``); unused for cron.
        """
        nxt: int | None
        if self.every_ms is not None:
            every = self.every_ms
            nxt = anchor_ms if t_ms < anchor_ms else anchor_ms + ((t_ms - anchor_ms) // every + 1) * every
        else:
            nxt = self._cron_after(t_ms)
        if nxt is None or nxt > MAX_MS or (self.end_ms is not None and nxt > self.end_ms):
            return None
        return nxt

    def _cron_after(self, t_ms: int) -> int | None:
        after = t_ms if self.start_ms is None else max(t_ms, self.start_ms - 1)
        for steps, ms in enumerate(self._cron_times(after)):
            if ms > after:
                return ms
            if steps > _SEARCH_STEPS:  # pragma: no cover - cronsim steps forward
                return None
        return None

    def _cron_times(self, after_ms: int) -> Iterator[int]:
        zone = zoneinfo.ZoneInfo(self.tz)
        start = datetime.fromtimestamp(after_ms / 1000, tz=zone)  # fold set right in a repeated hour
        expr = ALIASES.get(self.cron or "", self.cron or "")
        try:
            for dt in _cronsim().CronSim(expr, start):
                # cronsim may give a fire time of the hour a fall-back repeats
                # that is before `start` in real time: the caller skips it.
                yield int(dt.timestamp() * 1000)
        except (OverflowError, ValueError):  # stepped past year 9999: no more fire times
            return

    def catch_up(self, due_ms: int, now_ms: int, anchor_ms: int) -> tuple[int, int | None]:
        """Firing ``due_ms`` at ``now_ms``: how many fire times in ``[due, now]`` one job stands
        for (at most ``MAX_COUNTED``), and the first fire time after ``now_ms`` (None: ended)."""
        nxt = self.next_after(max(now_ms, due_ms), anchor_ms)
        if self.every_ms is not None:
            last = now_ms if nxt is None else min(now_ms, nxt - 1)
            if self.end_ms is not None:
                last = min(last, self.end_ms)
            count = 1 + max(0, (last - due_ms) // self.every_ms)
            return min(count, MAX_COUNTED), nxt
        count = 1
        for ms in self._cron_times(due_ms):
            if ms <= due_ms:
                continue
            if ms > now_ms or count >= MAX_COUNTED or (self.end_ms is not None and ms > self.end_ms):
                break
            count += 1
        return count, nxt


def timing(
    *,
    cron: object = None,
    every: object = None,
    tz: object = "UTC",
    start_at: object = None,
    end_at: object = None,
    now_ms: int | None = None,
) -> Timing:
    """Check a schedule's timing arguments; ``ConfigurationError`` names the first bad one."""
    if (cron is None) == (every is None):
        raise ConfigurationError("a schedule needs exactly one of cron= and every=")
    _zone(tz)
    start_ms = _when_ms(start_at, "start_at")
    end_ms = _when_ms(end_at, "end_at")
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise ConfigurationError(f"end_at ({end_at}) is before start_at ({start_at})")
    every_ms: int | None = None
    cron_text: str | None = None
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, (int, float, timedelta)):
            raise ConfigurationError(f"every must be seconds (a number) or a timedelta, got {every!r}")
        every_ms = to_ms(every, "every")
        if every_ms < 1:
            raise ConfigurationError(f"every must be positive (at least 1 ms), got {every!r}")
    else:
        if not isinstance(cron, str) or not cron.strip():
            raise ConfigurationError(f"cron must be a 5-field cron expression or an @alias, got {cron!r}")
        cron_text = " ".join(cron.split())
        expr = ALIASES.get(cron_text.lower(), cron_text)
        if cron_text.startswith("@") and cron_text.lower() not in ALIASES:
            raise ConfigurationError(f"unknown cron alias {cron!r}: use one of {', '.join(ALIASES)}")
        if cron_text.startswith("@"):
            cron_text = cron_text.lower()
        if len(expr.split()) != 5:
            raise ConfigurationError(
                f"cron {cron!r} must have 5 fields (minute hour day-of-month month day-of-week)"
            )
        cs = _cronsim()
        try:
            cs.CronSim(expr, datetime.now(UTC))
        except cs.CronSimError as exc:
            raise ConfigurationError(f"cron {cron!r} does not parse: {exc}") from None
    result = Timing(cron_text, every_ms, str(tz), start_ms, end_ms)
    if now_ms is not None and result.next_after(now_ms, result.first_anchor(now_ms)) is None:
        raise ConfigurationError("the schedule never fires: its end_at is past, or its cron matches no date")
    return result


# How a corrupt schedule's note starts (lua/include/schedule.lua writes the same
# words): the fire scripts pause it with this note, and readers mark it.
CORRUPT = "schedule is corrupt: "


class ScheduleFault(ValueError):
    """A schedule's own stored data cannot be used (its hash edited by hand); says which field."""


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _digits(value: str) -> bool:
    return value.isascii() and value.isdigit()


def _stored_ms(f: Mapping[str, str], name: str, *, required: bool = False) -> int | None:
    """A time field of a schedule's hash (ms since 1970); '' is none unless ``required``."""
    value = f.get(name, "")
    if value == "" and not required:
        return None
    if not _digits(value) or int(value) > MAX_MS:
        raise ScheduleFault(f"{name} field {_quoted(value)} is not a time in ms")
    return int(value)


def stored_timing(f: Mapping[str, str], *, parse_cron: bool = True) -> Timing:
    """The timing a schedule's hash holds, each field checked as ``timing()`` checks an argument.

    Raises:
        ScheduleFault: A field no worker can fire by (an every_ms of -5, a cron
            that does not parse, an unknown or host-local tz, a time that is
            not ms), named with its value.
        ConfigurationError: cronsim is not installed (not the schedule's fault).
    """
    cron, every = f.get("cron", ""), f.get("every_ms", "")
    if bool(cron) == bool(every):
        raise ScheduleFault(
            f"it has {'both' if cron else 'neither'} a cron {'and' if cron else 'nor'} an every_ms field"
        )
    every_ms: int | None = None
    if every:
        if not _digits(every) or not 1 <= int(every) <= MAX_SECONDS * 1000:
            raise ScheduleFault(f"every_ms field {_quoted(every)} is not a positive whole number of ms")
        every_ms = int(every)
    tz = f.get("tz") or "UTC"
    try:
        _zone(tz)
    except ConfigurationError:
        raise ScheduleFault(f"tz field {_quoted(tz)} is not one IANA time zone") from None
    if cron and parse_cron:
        expr = ALIASES.get(cron, cron)
        cs = _cronsim()
        try:
            if len(expr.split()) != 5:
                raise ValueError("not 5 fields")
            cs.CronSim(expr, datetime.now(UTC))
        except Exception:  # noqa: BLE001 - whatever cronsim makes of it, the field is wrong
            raise ScheduleFault(f"cron field {_quoted(cron)} does not parse") from None
    return Timing(cron or None, every_ms, tz, _stored_ms(f, "start_at"), _stored_ms(f, "end_at"))


def fire_plan(f: Mapping[str, str], now_ms: int) -> tuple[int, int, int | None]:
    """Firing a due schedule stored as ``f`` at ``now_ms``: its due fire time, how many
    fire times the job stands for, and the next fire time (None: it has ended).

    Raises:
        ScheduleFault: What in ``f`` no worker can fire by (the schedule is then
            paused with it as its note, lua/schedule_fire.lua).
    """
    when = stored_timing(f)
    fire_at = _stored_ms(f, "next_at", required=True)
    assert fire_at is not None  # required
    anchor = _stored_ms(f, "anchor") or 0
    try:
        fires, nxt = when.catch_up(fire_at, now_ms, anchor)
    except (ArithmeticError, ValueError) as exc:
        raise ScheduleFault(f"its next fire time cannot be computed ({exc})") from None
    return fire_at, fires, nxt


def next_fire(f: Mapping[str, str], now_ms: int) -> int | None:
    """The first fire time after ``now_ms`` of the schedule stored as ``f`` (a resume's)."""
    when = stored_timing(f)
    anchor = _stored_ms(f, "anchor") or 0
    try:
        return when.next_after(now_ms, anchor)
    except (ArithmeticError, ValueError) as exc:
        raise ScheduleFault(f"its next fire time cannot be computed ({exc})") from None


def checked_priority(priority: object) -> Priority | None:
    if priority is None:
        return None
    return Priority.parse(priority)  # type: ignore[arg-type]  # ConfigurationError names it


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule declared in code: ``vr.Worker(..., schedules=[vr.Schedule(...)])`` upserts it at start.

    The arguments are ``queue.schedule()``'s (checked here, when declared);
    ``queue`` names the worker's queue it belongs to (default: the worker's first).
    """

    id: str
    task: Task[Any]
    cron: str | None = None
    every: float | timedelta | None = None
    tz: str = "UTC"
    start_at: datetime | None = None
    end_at: datetime | None = None
    priority: Priority | int | str | None = None
    queue: str | None = None

    def __post_init__(self) -> None:
        validate_schedule_id(self.id)
        if not isinstance(self.task, Task):
            raise TaskDefinitionError(f"a schedule's task must be a vr.Task instance, got {self.task!r}")
        timing(cron=self.cron, every=self.every, tz=self.tz, start_at=self.start_at, end_at=self.end_at)
        checked_priority(self.priority)


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A snapshot of one schedule as stored (``queue.get_schedule()``, ``queue.schedules()``).

    ``kind`` is ``"cron"`` or ``"every"``; ``every`` in seconds. ``next_at`` is
    None while paused or once the schedule has ended (past ``end_at``);
    ``last_at`` is the fire time of the last job it made (None before the
    first), ``last_job_id`` that job (or the pending job a dedup key merged
    the fire into). ``fires``: jobs made so far (a catch-up counts once).
    """

    id: str
    queue: str
    kind: str
    cron: str | None
    every: float | None
    tz: str
    next_at: datetime | None
    last_at: datetime | None
    last_job_id: str | None
    paused: bool
    task_kind: str
    priority: Priority
    start_at: datetime | None
    end_at: datetime | None
    fires: int
    created_at: datetime | None
    updated_at: datetime | None
    note: str | None = None

    @property
    def corrupt(self) -> bool:
        """Its stored data is corrupt (edited by hand): ``note`` says what is wrong. A worker
        pauses it when it is next due; declaring it again (``queue.schedule``) repairs it."""
        return self.note is not None and self.note.startswith(CORRUPT)

    @classmethod
    def unreadable(cls, queue: str, schedule_id: str, why: str) -> ScheduleInfo:
        """A schedule whose key cannot be read as one (not a hash): listed, marked."""
        return cls(
            id=schedule_id,
            queue=queue,
            kind="",
            cron=None,
            every=None,
            tz="",
            next_at=None,
            last_at=None,
            last_job_id=None,
            paused=True,
            task_kind="",
            priority=Priority.NORMAL,
            start_at=None,
            end_at=None,
            fires=0,
            created_at=None,
            updated_at=None,
            note=CORRUPT + why,
        )

    @classmethod
    def from_hash(cls, queue: str, schedule_id: str, raw: dict[bytes, bytes]) -> ScheduleInfo:
        """Never raises: a field that cannot be read is None (0, NORMAL), and a timing no
        worker can fire by is named in ``note`` (``corrupt``) even before one tries."""
        f = {
            k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
            for k, v in raw.items()
            if k != b"payload"
        }

        def when(name: str) -> datetime | None:
            v = f.get(name, "")
            return ms_dt(int(v)) if _digits(v) and int(v) <= MAX_MS else None

        note = f.get("note") or None
        if note is None:
            try:
                stored_timing(f, parse_cron=_has_cronsim())
            except ScheduleFault as exc:
                note = CORRUPT + str(exc)
        every = f.get("every_ms", "")
        try:
            priority = Priority.parse(f.get("priority") or "normal")
        except ConfigurationError:
            priority = Priority.NORMAL
        paused = f.get("paused") == "1"
        return cls(
            id=schedule_id,
            queue=queue,
            kind="every" if every else "cron",
            cron=f.get("cron") or None,
            every=int(every) / 1000 if _digits(every) else None,
            tz=f.get("tz", "UTC"),
            next_at=None if paused else when("next_at"),
            last_at=when("last_at"),
            last_job_id=f.get("last_job_id") or None,
            paused=paused,
            task_kind=f.get("kind", ""),
            priority=priority,
            start_at=when("start_at"),
            end_at=when("end_at"),
            fires=int(f["fires"]) if _digits(f.get("fires", "")) else 0,
            created_at=when("created_at"),
            updated_at=when("updated_at"),
            note=note,
        )


# Schedule ids become part of a key (venturi:{q}:schedule:<id>): the queue names' rule.
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


def validate_schedule_id(value: object) -> str:
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise ConfigurationError(
            f"invalid schedule id {value!r}: use 1 to 128 characters from A-Z a-z 0-9 _ . -, "
            "starting with a letter or digit"
        )
    return value
