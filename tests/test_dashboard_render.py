"""The dashboard's text filters: times, journal details, the chart's geometry."""

from __future__ import annotations

from venturi_redis.dashboard._render import bars, detail, seconds, when


def test_journal_details_read_as_times_and_durations() -> None:
    assert detail("eligible_at", "1796520613934") == "2026-12-06 01:30:13Z"
    assert detail("lease_expires", "0") == "1970-01-01 00:00:00Z"
    assert detail("delay_ms", "1500") == "1.5 s"
    assert detail("worker", "web-1:42:ab") == "web-1:42:ab"
    assert detail("eligible_at", "soon") == "soon"  # not a stored time: shown as is


def test_times_and_durations() -> None:
    assert when(None) == "-"
    assert when("2026-12-06T01:30:13.934000+00:00") == "2026-12-06 01:30:13Z"
    assert [seconds(v) for v in (0.4, 720, 12_600, 181_440)] == ["0.4 s", "12 min", "3.5 h", "2.1 d"]


def test_chart_bars_scale_to_the_busiest_minute() -> None:
    out = bars([0, 5, 10], height=20)
    assert [b["h"] for b in out] == [0, 10, 20]
    assert [b["y"] for b in out] == [20, 10, 0]
    assert [b["x"] for b in out] == [0, 4, 8]
    assert [b["h"] for b in bars([0, 0])] == [0, 0]
    assert bars([1, 1000], height=28)[0]["h"] == 1  # a quiet minute still shows
