"""The dates ``--since`` / ``--until`` and ``trackbridge.read(since=, until=)`` take (issue 34 item 3), computed by
hand: a date is its day's start (or its last instant for ``until``), a time without an offset is UTC, an offset is
honoured, a duration counts back from now; anything else is a one-line error naming the option."""
from __future__ import annotations

import datetime as dt

import pytest

from trackbridge.errors import UsageError
from trackbridge.read.selection import Selection, parse_when

DAY = 86400.0
NOV1 = 1793491200.0          # 2026-11-01T00:00:00Z: (date(2026, 11, 1) - date(1970, 1, 1)).days * 86400


def test_the_forms_of_a_date():
    assert (dt.date(2026, 11, 1) - dt.date(1970, 1, 1)).days * DAY == NOV1
    assert parse_when("2026-11-01") == NOV1
    assert parse_when("2026-11-01", end_of_day=True) == NOV1 + DAY - 1e-6
    assert parse_when("2026-11-01T12:30") == NOV1 + 12.5 * 3600                     # UTC without an offset
    assert parse_when("2026-11-01T12:30Z") == NOV1 + 12.5 * 3600
    assert parse_when("2026-11-01T12:30+02:00") == NOV1 + 10.5 * 3600
    assert parse_when("2026-11-01T12:30", end_of_day=True) == NOV1 + 12.5 * 3600      # a time is that instant
    assert parse_when(dt.date(2026, 11, 1), end_of_day=True) == NOV1 + DAY - 1e-6
    assert parse_when(dt.datetime(2026, 11, 1, 6)) == NOV1 + 6 * 3600
    assert parse_when(NOV1 + 5) == NOV1 + 5
    now = NOV1 + 10 * DAY
    assert parse_when("7d", now=now) == NOV1 + 3 * DAY
    assert parse_when("36h", now=now) == now - 36 * 3600
    assert parse_when("90m", now=now) == now - 5400
    assert parse_when("2w", now=now) == now - 14 * DAY
    assert parse_when(" 1.5d ", now=now) == now - 1.5 * DAY


@pytest.mark.parametrize("bad", ["yesterday", "2026-02-30", "7 days", "", "d7", "2026/11/01"])
def test_a_bad_date_is_one_line_naming_the_option(bad):
    with pytest.raises(UsageError) as exc:
        parse_when(bad, "--until ")
    assert str(exc.value).startswith(f"--until {bad!r}: expected a date") and "\n" not in str(exc.value)


def test_a_selection_checks_every_part_when_built():
    sel = Selection.build(since="2026-11-01", until="2026-11-01")
    assert (sel.since, sel.until) == (NOV1, NOV1 + DAY - 1e-6) and sel.dated
    assert sel.describe() == " started since 2026-11-01T00:00:00Z, started until 2026-11-01T23:59:59Z"
    assert not Selection.build().dated and Selection.build().describe() == ""
    with pytest.raises(UsageError, match=r"^--until 2026-10-31T23:59:59Z is before --since 2026-11-01T00:00:00Z"):
        Selection.build(since="2026-11-01", until="2026-10-31")
    with pytest.raises(UsageError, match=r"^read: since=True: expected"):
        Selection.build(since=True, prefix="read: ")
    with pytest.raises(UsageError, match=r"^read: runs='\(' is not a regular expression"):
        Selection.build(runs="(", prefix="read: ")
    assert Selection.build(metrics="reward/*").metrics == ["reward/*"]
