"""Durations and timestamps: one parser for the whole package, UTC everywhere."""

from __future__ import annotations

import datetime as dt
import functools
import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_COMPOUND = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(value: object) -> float:
    """Return seconds for ``90``, ``"90s"``, ``"15m"``, ``"1h30m"``, ``"2d"``.

    Raises ``ValueError`` naming the value when it cannot be read.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"negative duration: {value!r}")
        return float(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        text = value.strip().lower()
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            return float(text)
        m = _DURATION.match(text)
        if m:
            return float(m.group(1)) * _UNITS[m.group(2)]
        parts = _COMPOUND.findall(text)
        if parts and "".join(n + u for n, u in parts) == text.replace(" ", ""):
            return sum(float(n) * _UNITS[u] for n, u in parts)
    raise ValueError(f"not a duration (use e.g. 90s, 15m, 1h, 2d): {value!r}")


def parse_duration_strict(value: str) -> float:
    """Return seconds for ``"15m"``, ``"1h30m"``, ``"2d"``: like :func:`parse_duration`, but a bare number is an error.

    For what a person types (``--for 4``: four hours? four seconds?); policy files keep
    :func:`parse_duration`, where plain numbers are seconds.
    """
    if re.fullmatch(r"\s*[+-]?\d+(?:\.\d+)?\s*", str(value)):
        raise ValueError("a duration needs a unit, e.g. 4h, 30m, 2d")
    return parse_duration(str(value))


def format_duration(seconds: float, parts: int | None = 2) -> str:
    """Return a short human form: ``1h30m``, ``15m``, ``45s``; at most ``parts`` units (None: exact,
    as a policy file writes it, e.g. ``1d2h3m4s``)."""
    seconds = round(seconds)
    if seconds <= 0:
        return "0s"
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, seconds = divmod(seconds, size)
        if n:
            out.append(f"{n}{unit}")
    return "".join(out[:parts] if parts is not None else out)


def utc(ts: object) -> dt.datetime:
    """Return an aware UTC datetime from a datetime, epoch seconds or ISO 8601 text."""
    if isinstance(ts, dt.datetime):
        return ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)
    if isinstance(ts, int | float):
        return dt.datetime.fromtimestamp(float(ts), tz=dt.UTC)
    if isinstance(ts, str):
        text = ts.strip()
        if re.fullmatch(r"-?\d+(?:\.\d+)?", text):
            return dt.datetime.fromtimestamp(float(text), tz=dt.UTC)
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)
    if hasattr(ts, "to_pydatetime"):
        return utc(ts.to_pydatetime())
    raise ValueError(f"not a timestamp: {ts!r}")


def epoch(ts: object) -> float:
    """Return epoch seconds for anything :func:`utc` reads."""
    if isinstance(ts, str):
        return _epoch_text(ts)
    return utc(ts).timestamp()


def iso(ts: object) -> str:
    """Return ISO 8601 UTC text with a ``Z``, second precision."""
    if isinstance(ts, int | float) and not isinstance(ts, bool):
        return _iso_number(ts)
    return utc(ts).replace(microsecond=0).isoformat().replace("+00:00", "Z")


# The audit store converts every time it writes and reads, and a replay's sweeps write the same few
# instants hundreds of thousands of times: both conversions are pure, so remembered.
@functools.lru_cache(maxsize=1 << 16)
def _epoch_text(ts: str) -> float:
    return utc(ts).timestamp()


@functools.lru_cache(maxsize=1 << 16)
def _iso_number(ts: float) -> str:
    return utc(ts).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def week_bounds(at: float, timezone: str = "UTC", weeks_back: int = 1) -> tuple[float, float]:
    """Return ``[since, until)`` of the ISO week (Monday 00:00 to Monday 00:00 in ``timezone``)
    ``weeks_back`` weeks before the one holding ``at``; ``weeks_back=1`` is the previous full week
    (what the Monday report covers), 0 the week of ``at``.

    The one definition of a week: the report's periods and the savings ledger's cap both use it.
    Raises ValueError for an unknown time zone.
    """
    from zoneinfo import ZoneInfo

    try:
        tz = ZoneInfo(timezone)
    except Exception as exc:  # ZoneInfo raises several kinds
        raise ValueError(f"unknown time zone {timezone!r}") from exc
    local = utc(at).astimezone(tz)
    monday = (local - dt.timedelta(days=local.weekday())).date() - dt.timedelta(days=7 * weeks_back)
    start = dt.datetime.combine(monday, dt.time(0, 0), tzinfo=tz)
    end = dt.datetime.combine(monday + dt.timedelta(days=7), dt.time(0, 0), tzinfo=tz)
    return start.timestamp(), end.timestamp()
