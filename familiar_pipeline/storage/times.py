"""Instants: every time this project stores or compares is an aware UTC ``datetime``.

One converter, :func:`as_utc`, used by the turn log, the projection store, the
serving snapshots and the fact extractor. It accepts aware datetimes in any
offset, naive datetimes, dates (UTC midnight) and ISO-8601 strings (``Z`` or an
offset, or none). A missing offset means UTC, never the host's local zone:
everything the project writes is UTC, so a naive value can only be UTC.
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from typing import Any, overload

UTC = timezone.utc


@overload
def as_utc(value: datetime | date | str, *, what: str = ...) -> datetime: ...
@overload
def as_utc(value: None, *, what: str = ...) -> None: ...
@overload
def as_utc(value: datetime | date | str | None, *, what: str = ...) -> datetime | None: ...
def as_utc(value: datetime | date | str | None, *, what: str = "timestamp") -> datetime | None:
    """``value`` as an aware UTC datetime (None stays None).

    Raises ValueError for a string that is not ISO-8601 and TypeError for any
    other type, both naming ``what``.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"{what}: {value!r} is not an ISO-8601 date or timestamp") from None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    raise TypeError(f"{what} must be a datetime, a date or an ISO-8601 string, got {type(value).__name__}")


def now_or(value: datetime | date | str | None, *, what: str = "now") -> datetime:
    """``as_utc(value)``, or the current instant when ``value`` is None."""
    return as_utc(value, what=what) if value is not None else datetime.now(UTC)


def utc_text(value: datetime | date | str | None, *, what: str = "timestamp") -> str:
    """Fixed-width ISO text in UTC (None: now), so string order is time order (SQLite columns)."""
    return now_or(value, what=what).isoformat(timespec="microseconds")


def parse_instant(value: Any) -> datetime | None:
    """A date or timestamp written by a model or a person, as UTC; None when absent or unreadable.

    The lenient form of :func:`as_utc` for untrusted text: anything that is not
    a non-blank ISO-8601 string reads as "no time given" instead of raising.
    """
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return as_utc(value)
    except ValueError:
        return None
