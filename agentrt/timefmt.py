"""Time and duration text exactly as the reference stores and prints it.

Stored times are UTC RFC 3339 with the fractional part trimmed of trailing
zeros (so they do not sort as text; every listing orders by rowid or seq).
The zero time is stored as "" and represented here as ``None``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

__all__ = [
    "ZERO_TIME",
    "format_duration",
    "format_time",
    "format_time_nano",
    "fraction_digits",
    "local_stamp",
    "parse_time",
    "to_unix_nanos",
]

#: What a stored time that does not parse reads as in page reads.
ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))\Z",
    re.ASCII,
)


def _is_stored_form(text: str) -> bool:
    """Whether ``text`` has the shape ``YYYY-MM-DDTHH:MM:SS[.d{1,9}]Z``.

    Only the separators are checked here; ``datetime.fromisoformat`` then
    checks the digits. It also accepts forms RFC 3339 does not (a space for
    ``T``, a comma for the dot, week dates, basic format, non-ASCII input is
    refused anyway), which is why it only sees this shape.
    """
    n = len(text)
    return (
        (n == 20 or (22 <= n <= 30 and text[19] == "."))
        and text[-1] == "Z"
        and text[10] == "T"
        and text[4] == "-"
        and text[7] == "-"
        and text[13] == ":"
        and text[16] == ":"
        and text.isascii()
        and (n == 20 or text[20:-1].isdigit())
    )


def _fraction(micro: int) -> str:
    return f".{micro:06d}".rstrip("0") if micro else ""


# The stored form of the last UTC reading formatted, as (reading, text). One
# clock reading is written several times in a row (an event's time and the
# row's, two events of one transaction), and formatting costs a dozen times
# an identity check. Kept by identity, not in a dict: hashing an aware
# datetime calls its tzinfo and costs a third of formatting it, and most
# readings are formatted once. One tuple, replaced whole, so threads never
# see a reading paired with another's text. It starts as None's text.
_LAST: tuple[datetime | None, str] = (None, "")


_TWO_DIGITS = tuple(f"{n:02d}" for n in range(100))
# The fields of the last second formatted and its text (``2026-10-01T09:00:05``):
# a step's readings mostly fall within one second. One tuple, replaced whole.
_SECOND: tuple[tuple[int, ...], str] = ((), "")


def _stored_form(t: datetime) -> str:
    """``t.replace(tzinfo=None).isoformat()`` with the fraction's trailing zeros
    trimmed, and ``Z``: the fields of ``t`` as they are (UTC or naive).

    Built from a table of two-digit strings: ``isoformat`` goes through C's
    printf-style formatting and the ``replace`` allocates, together several
    times this, and each clock reading is formatted once.
    """
    global _SECOND
    second = (t.year, t.month, t.day, t.hour, t.minute, t.second)
    last = _SECOND
    if last[0] == second:
        text = last[1]
    else:
        year, month, day, hour, minute, sec = second
        d = _TWO_DIGITS
        text = (f"{year if year >= 1000 else f'{year:04d}'}-{d[month]}-{d[day]}"
                f"T{d[hour]}:{d[minute]}:{d[sec]}")
        _SECOND = (second, text)
    micro = t.microsecond
    if micro:
        return f"{text}.{str(1_000_000 + micro)[1:].rstrip('0')}Z"
    return text + "Z"


def format_time(t: datetime | None) -> str:
    """Stored form: UTC, trailing fractional zeros trimmed, ``Z``; None -> ""."""
    global _LAST
    last = _LAST
    if last[0] is t:
        return last[1]
    if t is None:
        return ""
    utc = t.tzinfo is UTC
    if t == ZERO_TIME:
        return ""
    if t.tzinfo is not None and not utc:
        t = t.astimezone(UTC)
    if type(t) is datetime:
        text = _stored_form(t)
    else:  # a subclass may write its own isoformat (nanoseconds, say): use it
        text = t.replace(tzinfo=None).isoformat()
        text = (text.rstrip("0") if t.microsecond else text) + "Z"
    if utc:
        _LAST = (t, text)
    return text


def format_time_nano(t: datetime | None) -> str:
    """RFC 3339 with trimmed fraction in the time's own zone (Go's RFC3339Nano)."""
    if t is None:
        t = ZERO_TIME
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    off = t.utcoffset() or timedelta(0)
    base = t.replace(tzinfo=None, microsecond=0).isoformat() + _fraction(t.microsecond)
    if not off:
        return base + "Z"
    seconds = int(off.total_seconds())
    minutes = abs(seconds) // 60  # whole minutes toward zero, as Go's layout does
    sign = "-" if seconds < 0 and minutes else "+"
    return f"{base}{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 64 else repr(text[:64]) + "..."


def parse_time(text: str) -> datetime | None:
    """Parse a stored time; "" is the zero time (None). Raises ValueError otherwise.

    Nanosecond digits beyond microseconds (a database written by the Go
    reference) are truncated, which Python's datetime cannot hold.
    """
    if text == "":
        return None
    if _is_stored_form(text):
        # The form the runtime writes: fromisoformat is several times faster
        # than the general pattern below and drops digits past microseconds.
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            pass  # the pattern below words the error
    m = _RFC3339.match(text)
    if m is None:
        raise ValueError(f"time {_shown(text)} is not RFC 3339")
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    frac = m.group(7) or ""
    micro = int((frac + "000000")[:6])
    try:
        if m.group(8):
            tz = UTC
        else:
            delta = timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
            tz = timezone(delta if m.group(9) == "+" else -delta)
        t = datetime(year, month, day, hour, minute, second, micro, tzinfo=tz)
        return t.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"time {_shown(text)} is out of range: {exc}") from None


def fraction_digits(text: str) -> str | None:
    """The fraction of a second an RFC 3339 ``text`` states, to the nanosecond and
    without trailing zeros ('' for a whole second), or None when ``text`` is not
    RFC 3339. A datetime keeps only microseconds; an offset is whole minutes, so
    the fraction is the same in UTC."""
    m = _RFC3339.match(text)
    if m is None:
        return None
    return (m.group(7) or "").rstrip("0")


def to_unix_nanos(t: datetime) -> int:
    """Integer nanoseconds since the epoch, exact for microsecond datetimes."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    delta = t - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _fmt_frac(v: int, prec: int) -> tuple[str, int]:
    """Go's fmtFrac: the fractional digits of v / 10**prec, trailing zeros dropped."""
    digits = ""
    printed = False
    for _ in range(prec):
        d = v % 10
        printed = printed or d != 0
        if printed:
            digits = str(d) + digits
        v //= 10
    return ("." + digits if printed else ""), v


def format_duration(ns: int) -> str:
    """Go's time.Duration.String: ``1h0m0s``, ``1m30s``, ``25s``, ``500ms``, ``0s``."""
    if ns == 0:
        return "0s"
    neg = ns < 0
    u = -ns if neg else ns
    if u < 1_000_000_000:
        if u < 1_000:
            text = f"{u}ns"
        elif u < 1_000_000:
            frac, whole = _fmt_frac(u, 3)
            text = f"{whole}{frac}µs"
        else:
            frac, whole = _fmt_frac(u, 6)
            text = f"{whole}{frac}ms"
    else:
        frac, whole = _fmt_frac(u, 9)
        secs = whole % 60
        whole //= 60
        text = f"{secs}{frac}s"
        if whole:
            mins = whole % 60
            hours = whole // 60
            text = f"{mins}m{text}"
            if hours:
                text = f"{hours}h{text}"
    return "-" + text if neg else text


def local_stamp(t: datetime, *, millis: bool = False) -> str:
    """``2006-01-02 15:04:05[.000] -0700`` in the local zone, as the operator
    sees times: milliseconds truncated, as Go's layout does. A time the local
    zone cannot hold (near year 1 or 9999) keeps its own zone."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    try:
        local = t.astimezone()
    except (OverflowError, ValueError):
        local = t
    seconds = int((local.utcoffset() or timedelta(0)).total_seconds())
    zone = abs(seconds) // 60  # whole minutes toward zero, as Go's layout does
    sign = "-" if seconds < 0 and zone else "+"
    hours, minutes = divmod(zone, 60)
    fraction = f".{local.microsecond // 1000:03d}" if millis else ""
    return (
        f"{local.year:04d}-{local.month:02d}-{local.day:02d} "
        f"{local.hour:02d}:{local.minute:02d}:{local.second:02d}{fraction} "
        f"{sign}{hours:02d}{minutes:02d}"
    )
