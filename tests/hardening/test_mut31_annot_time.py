"""Mutation audit 31a, the times of records (spec §5; ``io/annotations.py``): a record's time
in microseconds since 1970 decides whether it is dated ahead (a fast clock), which pass a
listing shows and which records pruning keeps.

Each test names the mutant it kills.
"""

from __future__ import annotations

import datetime as dt

import pytest

from portable_ckpt.io.annotations import timestamp_us

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize("text", [
    "2026-01-31T23:59:59.999999Z", "2026-02-01T00:00:00Z", "2026-02-15T12:30:00.5Z",
    "2024-02-29T08:00:00.000001Z", "2026-03-01T00:00:00Z", "2026-12-31T23:59:59Z",
    "2000-02-29T00:00:00.123456789Z", "1970-01-01T00:00:00Z", "1969-12-31T23:59:59Z",
])
def test_a_timestamp_is_the_microseconds_a_calendar_gives(text: str) -> None:
    """Every month, leap day and fraction as the proleptic Gregorian calendar counts it.
    Mutant A03 (``month < 2`` for the year a date is counted in): every February counted a
    year late, so a pass recorded in February read as dated ahead for the rest of the year
    (``ls`` warned of a fast clock, pruning and ``last_pass`` passed it over)."""
    whole, _, frac = text[:-1].partition(".")
    when = dt.datetime.fromisoformat(whole).replace(tzinfo=dt.UTC)
    micro = int((frac + "000000")[:6]) if frac else 0
    expect = (when - _EPOCH) // dt.timedelta(microseconds=1) + micro
    assert timestamp_us(text) == expect


def test_days_past_a_month_end_roll_over_and_no_time_is_minus_one() -> None:
    """§5 accepts ``2026-02-31`` (fields, not a calendar); it counts as 3 March. A record with
    no time (or none that parses) is ``-1``, before every time (mutant A07: ``0``, which a
    manager's freshness gauge took for a save at 1970-01-01)."""
    assert timestamp_us("2026-02-31T00:00:00Z") == timestamp_us("2026-03-03T00:00:00Z")
    assert timestamp_us(None) == -1
    assert timestamp_us("2026-02-31T00:00:00") == -1  # no Z: no format timestamp
