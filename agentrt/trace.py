"""Render events for people (an aligned line) and for log tools (JSON Lines).

Two outputs, both fed one event at a time by the driver's observers or by the
exporter:

* :func:`writer` prints one aligned line per event for a terminal. Payloads
  come from agents and tools, so they pass through :func:`sanitize` first:
  nothing in them can move the cursor, recolour the terminal, reorder the text
  (bidi overrides) or hide characters.
* :func:`jsonl` writes :func:`jsonl_record`, the one JSON Lines record. The
  export sink (:class:`agentrt_export.JSONLSink`) writes the same function's
  bytes, so a live trace and a later export of the same events are identical,
  but for a payload over 64 Ki characters: the export reads it capped, as the
  truncation object, while the live trace writes the payload it was given.

Streams may be binary or text. Binary (``sys.stdout.buffer``, a file opened
``"wb"``) is preferred: the bytes written are exactly the record's, with no
encoding or newline translation in between. A text stream whose encoding is
not UTF-8 (``PYTHONIOENCODING=ascii``, a file opened ``encoding="latin-1"``)
is written UTF-8 through its binary buffer: a record is UTF-8 by definition.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import io
import json
import os
import re
import select
import socket
import stat
import threading
import time
import unicodedata
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import IO, Any

import orjson

from agentrt.errors import AgentrtError, described
from agentrt.events import OWN_EVENT_CLASSES, Event, Observer
from agentrt.gojson import STRING_PATTERN, encode_string
from agentrt.timefmt import format_time_nano, fraction_digits, local_stamp, parse_time

__all__ = [
    "LineWriter",
    "OutputStopped",
    "aligned_line",
    "check_stream",
    "display_width",
    "is_mark",
    "jsonl",
    "jsonl_page",
    "jsonl_record",
    "jsonl_with_err",
    "pad",
    "sanitize",
    "writer",
    "writer_with_err",
]

# --------------------------------------------------------------------------
# sanitize

#: Characters escaped or replaced one by one: C0, DEL, C1, lone surrogates (what
#: undecodable bytes become) and the invisible format characters that can
#: reorder or hide text. The tag block, the only such range above the BMP,
#: is kept apart (see _unicode_pattern).
_SPECIAL = (
    "\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u2064\u2066-\u2069\ufeff\ud800-\udfff"
)
_TAGS = "\U000e0000-\U000e007f"
_ASTRAL = "\U00010000-\U0010ffff"
_ASCII_SPECIAL = re.compile("[\x00-\x1f\x7f]")

#: How many combining marks one base character may carry before the rest are
#: dropped (stacked marks, "Zalgo text", can cover neighbouring lines).
_MAX_MARKS = 4


def _mark_ranges() -> tuple[str, str]:
    """Regex class bodies for every combining mark (category M) Python knows:
    those in the BMP, and those above it.

    Marks live only in planes 0, 1 and 14, so scanning those (some 40 ms, once,
    on the first non-ASCII text) finds all of them; a test checks the pattern
    against the whole of Unicode.
    """
    from unicodedata import category

    bmp: list[str] = []
    astral: list[str] = []
    start = -1
    for cp in [*range(0x300, 0x20000), *range(0xE0000, 0xE1000), 0x110000]:
        is_mark = cp < 0x110000 and category(chr(cp))[0] == "M"
        if is_mark and start < 0:
            start = cp
        elif not is_mark and start >= 0:
            end = cp - 1
            part = chr(start) if start == end else f"{chr(start)}-{chr(end)}"
            (bmp if end <= 0xFFFF else astral).append(part)
            start = -1
    return "".join(bmp), "".join(astral)


@cache
def _unicode_pattern() -> re.Pattern[str]:
    """One special character, or a run of more than four combining marks.

    Shaped for sre's speed: the pattern opens with a single class holding
    every candidate, so the search skips other text in C, and lookbehinds then
    say what was found. sre tests a BMP class in constant time but walks a
    list for astral ranges, so an astral mark costs one range test before its
    list is consulted.
    """
    bmp_marks, astral_marks = _mark_ranges()
    mark = f"(?:[{bmp_marks}]|[{_ASTRAL}](?<=[{astral_marks}]))"
    return re.compile(
        f"[{_SPECIAL}{bmp_marks}{_ASTRAL}]"
        f"(?:(?<=[{_SPECIAL}{_TAGS}])|(?<={mark}){mark}{{{_MAX_MARKS},}})"
    )


def _fix(m: re.Match[str]) -> str:
    text = m.group()
    if len(text) > 1:  # a run of too many combining marks
        dropped = len(text) - _MAX_MARKS
        return f"{text[:_MAX_MARKS]}[+{dropped} combining marks dropped]"
    o = ord(text)
    if o == 0x0A or o == 0x0D:
        return " "
    if o < 0x20 or 0x7F <= o <= 0x9F:
        return f"\\x{o:02x}"
    if 0xD800 <= o <= 0xDFFF:
        return "\ufffd"
    return f"\\u{{{o:04x}}}"


def _fix_ascii(m: re.Match[str]) -> str:
    o = ord(m.group())
    return " " if o == 0x0A or o == 0x0D else f"\\x{o:02x}"


def sanitize(s: str) -> str:
    """Make untrusted text safe to print on one terminal line.

    Newlines become spaces; control characters become ``\\xHH``; invisible
    format characters (bidi controls, zero-width characters, line and
    paragraph separators, tag characters) become ``\\u{xxxx}``; lone
    surrogates (undecodable bytes) become U+FFFD; more than four combining
    marks on one character keep four and say how many were dropped. Text
    that needs none of this is returned as the same object.
    """
    if s.isascii():
        if _ASCII_SPECIAL.search(s) is None:
            return s
        return _ASCII_SPECIAL.sub(_fix_ascii, s)
    pattern = _unicode_pattern()
    if pattern.search(s) is None:
        return s
    return pattern.sub(_fix, s)


# --------------------------------------------------------------------------
# the JSON Lines record

_WHITESPACE = b" \t\n\r"
_SP, _TAB, _LF, _CR = _WHITESPACE
#: Valid JSON split into strings and runs of other non-whitespace bytes;
#: joining them drops exactly the insignificant whitespace. Possessive (as
#: gojson's): the backtracking form kept a stack that grew with the string,
#: 234 MB over a 15 MB payload.
_PIECES = re.compile(STRING_PATTERN + rb'|[^" \t\n\r]+', re.DOTALL)
_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError
_JSONEncodeError = orjson.JSONEncodeError


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_STRICT = json.JSONDecoder(parse_constant=_reject_constant, parse_float=str, parse_int=str)


def _is_json_slow(payload: bytes) -> bool:
    """The verdict for what orjson refuses but JSON allows: numbers beyond a
    double, escaped lone surrogates. Strict UTF-8 first, so no BOM or UTF-16
    text slips through the stdlib's encoding detection."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    try:
        _STRICT.decode(text)
    except (ValueError, RecursionError):
        return False
    return True


def _compacted(payload: bytes) -> bytes:
    """``payload`` (valid JSON) without insignificant whitespace.

    Without an escaped quote every ``"`` delimits a string, so the even
    pieces of a split on ``"`` are exactly the text outside strings: a path
    that stays in C and usually finds the whitespace was all inside strings.
    """
    find = payload.find
    if find(b" ") < 0 and find(b"\n") < 0 and find(b"\t") < 0 and find(b"\r") < 0:
        return payload
    if b'\\"' in payload:
        return b"".join(_PIECES.findall(payload))
    parts = payload.split(b'"')
    outside = parts[0::2]
    joined = b"".join(outside)
    if len(joined.translate(None, _WHITESPACE)) == len(joined):
        return payload
    parts[0::2] = [piece.translate(None, _WHITESPACE) for piece in outside]
    return b'"'.join(parts)


#: What Go's unicode.IsSpace calls space (bytes.TrimSpace trims it).
_GO_SPACE = (" \t\n\v\f\r\x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
             + "\u2028\u2029\u202f\u205f\u3000")


def _unparsed(payload: bytes) -> bytes:
    """What to embed for a payload orjson refused: ``{}`` when it is blank,
    the payload when the strict check finds it is JSON after all, else the
    payload as a string followed by the ``invalid_payload`` flag."""
    if not payload.strip() or not payload.decode("utf-8", "surrogateescape").strip(_GO_SPACE):
        return b"{}"  # blank as Go's bytes.TrimSpace sees it: \v, \f, U+00A0, U+3000 too
    if _is_json_slow(payload):
        return _compacted(payload)
    text = payload.decode("utf-8", "surrogateescape")  # one U+FFFD per bad byte, as Go
    return encode_string(text, False).encode("utf-8") + b',"invalid_payload":true'


_QUOTED: dict[str, bytes] = {}
_QUOTED_MAX_ENTRIES = 4096
_QUOTED_MAX_LEN = 128


def _quoted(s: str) -> bytes:
    """``s`` as a JSON string (Go style, HTML escaping off), memoised because
    run ids, step ids and types repeat from event to event."""
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        q = b'"' + s.encode() + b'"'  # nothing to escape: most ids
    else:
        q = encode_string(s, False).encode("utf-8")  # lone surrogates come out escaped
    if len(s) <= _QUOTED_MAX_LEN and type(s) is str:  # a subclass may encode otherwise
        if len(_QUOTED) >= _QUOTED_MAX_ENTRIES:
            _QUOTED.clear()
        _QUOTED[s] = q
    return q


_SECONDS: dict[tuple[int, int, int, int, int, int], bytes] = {}


def _second(key: tuple[int, int, int, int, int, int]) -> bytes:
    """The whole-second part of a UTC time, memoised: events come in bursts
    within a second. Years below 1000 get four digits, as Go writes them."""
    text = b"%04d-%02d-%02dT%02d:%02d:%02d" % key
    if len(_SECONDS) >= 1024:
        _SECONDS.clear()
    _SECONDS[key] = text
    return text


#: A stored time in the form the record writes: UTC, ``Z``, a fraction of at
#: most nine digits without trailing zeros (``format_time``'s output, or the
#: Go reference's nanoseconds, which a datetime could not hold). Checked
#: in two parts: the whole second (memoised with its validity, as events come
#: many to a second), then what follows it.
_STORED_SECOND = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\Z")
_STORED_TAIL = re.compile(r"(?:\.[0-9]{0,8}[1-9])?Z\Z")
_VALID_SECONDS: dict[str, bool] = {}


def _valid_second(text: str) -> bool:
    """Whether ``text`` is ``YYYY-MM-DDTHH:MM:SS`` and names a real second (no
    month 13, no February 30th); remembered for the next events."""
    valid = _STORED_SECOND.match(text) is not None
    if valid:
        try:
            datetime.fromisoformat(text)
        except ValueError:
            valid = False
    if len(_VALID_SECONDS) >= 1024:
        _VALID_SECONDS.clear()
    _VALID_SECONDS[text] = valid
    return valid


def _stated_fraction(text: str, t: datetime) -> bytes:
    """The record's fraction and ``Z`` for a time stored in another form (trailing
    zeros, an offset): the digits the text states, to the nanosecond, as Go
    keeps them; ``t`` (its parse) holds only microseconds. A text that did not
    parse reads as the zero time, which has no fraction."""
    digits = fraction_digits(text)
    if digits is not None:
        try:
            parse_time(text)
        except ValueError:
            digits = None
    if digits is None:
        digits = f"{t.microsecond:06d}".rstrip("0")
    return b"." + digits.encode() + b"Z" if digits else b"Z"


_RECORD = b'{"seq":%d,"run_id":%b%b,"at":"%b%b","type":%b,"payload":%b}\n'


def jsonl_record(event: Event) -> bytes:
    """The JSON Lines record of ``event``, newline included.

    Keys in order: ``seq``, ``run_id``, ``step_id`` (omitted when empty),
    ``at`` (RFC 3339 in the time's own zone), ``type``, ``payload`` (the
    stored JSON, compacted, ``{}`` when blank). A payload that is not JSON is
    kept as a string with ``"invalid_payload":true`` rather than dropped.
    HTML characters are written literally, as Go's encoder does with HTML
    escaping off.
    """
    # Written flat on purpose: it runs once per exported event, and a helper
    # call costs about a tenth of a record.
    payload = event.payload
    try:
        value = _loads(payload)  # the check that it is JSON at all
        # A payload without a whitespace byte is compact already. Else: orjson's
        # output has no whitespace outside strings, so a payload equal to it is
        # compact too; only the rest is looked at again. (An int tests one byte
        # with memchr, ten times cheaper than a one-byte bytes needle.)
        if (_SP in payload or _LF in payload or _TAB in payload or _CR in payload) \
                and _dumps(value) != payload:
            payload = _compacted(payload)
    except _JSONDecodeError:
        payload = _unparsed(payload)
    except _JSONEncodeError:  # valid, but an integer orjson cannot write back
        payload = _compacted(payload)

    at_text = event.at_text
    second = at_text[:19]
    valid = _VALID_SECONDS.get(second)
    if valid is None:
        valid = _valid_second(second)
    if valid and _STORED_TAIL.match(at_text, 19):
        # Stored by the runtime: UTC, trailing fractional zeros trimmed, which
        # is the record's form already (what the branch below would rebuild).
        at, at_tail = at_text.encode(), b""
    elif (t := event.at).tzinfo is UTC:  # every time read from a store
        key = (t.year, t.month, t.day, t.hour, t.minute, t.second)
        at = _SECONDS.get(key) or _second(key)
        at_tail = _stated_fraction(at_text, t)
    else:
        at, at_tail = format_time_nano(t).encode(), b""

    run_id, step_id, type_ = event.run_id, event.step_id, event.type
    return _RECORD % (
        event.seq,
        _QUOTED.get(run_id) or _quoted(run_id),
        b',"step_id":' + (_QUOTED.get(step_id) or _quoted(step_id)) if step_id else b"",
        at,
        at_tail,
        _QUOTED.get(type_) or _quoted(type_),
        payload,
    )


try:
    from agentrt._jsonlpage import join_records as _join_records
except ImportError:  # installed without a C compiler: the same bytes, written slower
    _join_records = None  # type: ignore[assignment]


def jsonl_page(events: Sequence[Event]) -> bytes:
    """The records of ``events`` joined: the bytes of :func:`jsonl_record` for each.

    Events in the runtime's own form (plain ids, a stored UTC time, a JSON
    payload) are written by a small C module, five to six times faster;
    every other event by :func:`jsonl_record`, which the C path is held
    byte-equal to (``tests/test_jsonl_page.py``).
    """
    if _join_records is None:
        return b"".join([jsonl_record(e) for e in events])
    return _join_records(events, OWN_EVENT_CLASSES, jsonl_record)


# --------------------------------------------------------------------------
# the aligned line


def is_mark(char: str) -> bool:
    """Whether ``char`` is a combining mark, drawn over the character before it."""
    return bool(unicodedata.combining(char)) or unicodedata.category(char) in ("Mn", "Me")


def display_width(text: str) -> int:
    """The terminal columns ``text`` takes: two for a wide or fullwidth
    character (CJK, most emoji), none for a combining mark or an invisible
    format character, one for any other (East Asian "ambiguous" ones too, as
    terminals outside CJK locales draw them)."""
    if text.isascii():
        return len(text)
    width = 0
    for char in text:
        kind = unicodedata.category(char)
        if kind in ("Mn", "Me", "Cf") or unicodedata.combining(char):
            continue
        # Unassigned code points (Cn) say "F" in Python's table; terminals draw one cell.
        wide = kind != "Cn" and unicodedata.east_asian_width(char) in ("W", "F")
        width += 2 if wide else 1
    return width


def pad(text: str, columns: int) -> str:
    """``text`` followed by the spaces that make it ``columns`` wide on a terminal
    (``str.ljust`` counts characters, so wide ones would push the rest right)."""
    return text + " " * (columns - display_width(text))


def aligned_line(event: Event) -> str:
    """One terminal line: local time, two spaces, the type padded to 22
    columns, a space and the sanitized payload. The type is sanitized too:
    a database read later may hold anything in that column."""
    payload = sanitize(event.payload.decode("utf-8", "surrogateescape"))
    return f"{local_stamp(event.at, millis=True)}  {pad(sanitize(event.type), 22)} {payload}\n"


# --------------------------------------------------------------------------
# writing whole lines


def _is_text(stream: Any) -> bool:
    return isinstance(stream, io.TextIOBase) or (
        hasattr(stream, "encoding") and hasattr(stream, "buffer")
    )


def _encodes_utf8(stream: Any) -> bool:
    """Whether a text stream's str comes out UTF-8 (one with no encoding, as
    ``io.StringIO``, keeps the str itself)."""
    encoding = getattr(stream, "encoding", None)
    if not isinstance(encoding, str):
        return True
    try:
        return codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return True


class _UTF8UnderText:
    """A text stream that does not encode UTF-8, written through its binary
    buffer. Through the text layer a record would be other bytes than the
    export's, or a UnicodeEncodeError at the first non-ASCII character that
    ends the trace; the text layer is flushed first, so what the consumer
    wrote through it stays in order."""

    def __init__(self, text: Any) -> None:
        self._text = text
        self._buffer = text.buffer

    def write(self, data: bytes | memoryview) -> int | None:
        self._text.flush()
        n: int | None = self._buffer.write(data)
        if n is None and isinstance(self._buffer, io.RawIOBase):
            raise BlockingIOError(errno.EAGAIN, "the output would block; nothing was written")
        return n

    def flush(self) -> None:
        self._text.flush()  # the text layer, then its buffer

    def fileno(self) -> int:
        return int(self._buffer.fileno())


class OutputStopped(AgentrtError):
    """A :class:`LineWriter`'s ``stop`` was set while it waited for a full
    output to take more: the write was given up part way, after
    :attr:`LineWriter.arrived` bytes of a :meth:`LineWriter.write_through`."""

    base = "agentrt: the output was full (its reader took no more) when the stop came"


#: How long a wait on a full descriptor goes before it looks at ``stop`` again.
_STOP_POLL_MS = 50


def stop_grace_seconds(default: float = 5.0) -> float:
    """The seconds a stop grants an output (or a collector) that takes nothing
    more: ``default``, or less when the private ``AGENTRT_STOP_GRACE_S`` says
    so. That variable exists so that the tests of a stop running out of grace
    need not sit the whole grace out; anything but a positive number of
    seconds up to ``default`` in it is ignored. Read once, at import."""
    try:
        wanted = float(os.environ.get("AGENTRT_STOP_GRACE_S", ""))
    except ValueError:
        return default
    return wanted if 0 < wanted <= default else default


#: How long a stop lets a record already part written wait to be finished.
_FINISH_RECORD_S = stop_grace_seconds()


class LineWriter:
    """Writes whole lines to one stream from many threads.

    A lock keeps concurrent lines whole. The first write (or flush) failure
    is remembered: every later line fails with it too, so whoever feeds the
    writer stops at the first lost line instead of leaving a gap.

    With ``wait``, a non-blocking descriptor that is full is waited out, as a
    blocking one would be; ``stop``, once set, ends such a wait (a reader that
    takes nothing must not hold up a shutdown for ever) with
    :class:`OutputStopped`.
    """

    def __init__(self, stream: IO[bytes] | IO[str], *, flush_each: bool = True,
                 wait: bool = False, stop: threading.Event | None = None) -> None:
        self._stream: Any = stream
        self._text = _is_text(stream)
        if self._text and not _encodes_utf8(stream) and hasattr(stream, "buffer"):
            self._stream, self._text = _UTF8UnderText(stream), False
        self._flush_each = flush_each and hasattr(stream, "flush")
        #: Whether :meth:`write` waits out a non-blocking descriptor that is full
        #: (the line goes straight to the descriptor then, so flush_each holds).
        self._wait = wait and plain_descriptor(self._stream) is not None
        self._stop = stop
        self._lock = threading.Lock()
        self._err: Exception | None = None
        #: Bytes of the last :meth:`write_through` known to have arrived.
        self.arrived = 0

    def err(self) -> Exception | None:
        """The first failure, or None."""
        return self._err

    def write(self, line: bytes | str) -> None:
        """Write ``line`` whole (and flush, if asked to); raise on failure."""
        with self._lock:
            if self._err is not None:
                raise self._err.with_traceback(None)
            try:
                fd = self._nonblocking_fd() if self._wait else None
                if fd is not None:
                    self._write_waiting(fd, line.encode("utf-8") if isinstance(line, str) else line)
                elif (direct := self._direct_fd()) is not None:
                    self._write_fd(direct, line.encode("utf-8") if isinstance(line, str) else line)
                    return
                elif self._text:
                    self._stream.write(line.decode("utf-8") if isinstance(line, bytes) else line)
                else:
                    self._write_bytes(line.encode("utf-8") if isinstance(line, str) else line)
                if self._flush_each and fd is None:
                    self._stream.flush()
            except Exception as exc:
                self._err = exc
                raise

    def _direct_fd(self) -> int | None:
        """With ``flush_each``, the descriptor under a file object of Python's own
        (``open()``, ``sys.stdout``), its layers flushed first; else None. A line
        written there leaves nothing buffered behind it, so after a failure (a
        full disk) no stale record is left for the owner's ``close()`` to fail on."""
        if not self._flush_each:
            return None
        fd = plain_descriptor(self._stream)
        if fd is None:
            return None
        self._stream.flush()
        return fd

    @staticmethod
    def _write_fd(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            if n == 0:
                raise OSError("write took no bytes")
            view = view[n:]

    def _nonblocking_fd(self) -> int | None:
        """The stream's descriptor when it is non-blocking, else None. Asked at
        every line: a program (or a library in it) may switch the mode later."""
        fd = plain_descriptor(self._stream)
        if fd is None:
            return None
        try:
            return None if os.get_blocking(fd) else fd
        except OSError:
            return None  # the stream's own write then says what is wrong

    def _write_waiting(self, fd: int, data: bytes, *, counted: bool = False,
                       blocking: bool = False) -> None:
        """Write ``data`` whole to the non-blocking ``fd``, waiting whenever it
        is full, as a blocking descriptor would (and as the Go reference does);
        with ``counted``, adding to :attr:`arrived` what ``fd`` took.

        The stream's layers would lose track of a line cut short by EAGAIN (a
        text stream drops what it had pending), so what they hold is pushed
        out first and the line goes to the descriptor itself. A reader that
        has gone (EPIPE) or any other error still raises, and so does a stop.
        A ``blocking`` pipe is waited on the same way, a pipe buffer's worth
        at a time once poll says it has room, so that a stop ends the wait
        there too instead of a write blocked on a reader that takes nothing.
        """
        self._flush_waiting(fd)
        view = memoryview(data)
        done, end, deadline = 0, len(data), None
        while done < end:
            if blocking:
                end, deadline = self._await_room(fd, data, done, end, deadline)
                n = os.write(fd, view[done:min(end, done + select.PIPE_BUF)])
            else:
                try:
                    n = os.write(fd, view[done:end])
                except BlockingIOError:
                    end, deadline = self._await_room(fd, data, done, end, deadline)
                    continue
            if n == 0:
                raise OSError("write took no bytes")
            if counted:
                self.arrived += n
            done += n
        if end < len(data):
            raise OutputStopped  # the record in hand was finished, the rest given up

    def _await_room(self, fd: int, data: bytes, done: int, end: int,
                    deadline: float | None) -> tuple[int, float | None]:
        """Wait until ``fd`` takes bytes; the (end, deadline) of the write then.

        A stop part way through a record narrows the write to that record's
        end and gives it a few seconds (a reader that still reads gets no
        torn line); at a record's edge, or once those seconds pass, the stop
        raises :class:`OutputStopped`."""
        while True:
            try:
                _wait_writable(fd, self._stop if deadline is None else None, deadline)
                return end, deadline
            except OutputStopped:
                if deadline is not None or done == 0 or data[done - 1] == 0x0A:
                    raise
                newline = data.find(b"\n", done)
                end = newline + 1 if newline >= 0 else end
                deadline = time.monotonic() + _FINISH_RECORD_S

    def _flush_waiting(self, fd: int) -> None:
        """Push out what the stream's layers hold, waiting while ``fd`` is full."""
        if not hasattr(self._stream, "flush"):
            return
        while True:
            try:
                self._stream.flush()
                return
            except BlockingIOError:
                _wait_writable(fd, self._stop)

    def _write_bytes(self, data: bytes) -> None:
        n = self._stream.write(data)
        if n is None and isinstance(self._stream, io.RawIOBase):
            # A raw stream's None is "nothing written, it would block", not success.
            raise BlockingIOError(errno.EAGAIN, "the output would block; nothing was written")
        if n is None or n >= len(data):  # None: a writer that does not count
            return
        view = memoryview(data)[n:]  # a raw stream may take part of it
        while view:
            n = self._stream.write(view)
            if n is None:
                raise BlockingIOError(errno.EAGAIN, "the output would block mid-record")
            if n == 0:
                raise OSError("write took no bytes")
            view = view[n:]

    def write_through(self, data: bytes) -> None:
        """Write ``data`` and flush it, as :meth:`write` then :meth:`flush` would,
        counting in :attr:`arrived` the bytes known to have reached the
        destination: after a failure (a full disk, a file size limit) some may
        have. A binary file object of Python's own over a regular file is
        flushed, then written with ``os.write``, which says how much the file
        took; any other stream (a compressor's file among them, written with
        its own ``write``) counts all or nothing (what a pipe took, its reader
        may never read), but for a wait that ``stop`` cut short: its reader
        is still there, so what the descriptor took is counted."""
        with self._lock:
            self.arrived = 0
            if self._err is not None:
                raise self._err.with_traceback(None)
            try:
                fd = self._flushed_fd()
                if fd is None and self._wait and (waiting := self._nonblocking_fd()) is not None:
                    self._write_through_waiting(waiting, data)
                    return
                if fd is None and (pipe := self._stoppable_pipe()) is not None:
                    self._write_through_waiting(pipe, data, blocking=True)
                    return
                if fd is None:
                    if self._text:
                        self._stream.write(data.decode("utf-8"))
                    else:
                        self._write_bytes(data)  # a raw stream may take part of it
                    if hasattr(self._stream, "flush"):
                        self._stream.flush()
                    self.arrived = len(data)
                    return
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    self.arrived += n
                    view = view[n:]
            except Exception as exc:
                self._err = exc
                raise

    def _stoppable_pipe(self) -> int | None:
        """With a ``stop``, the descriptor of a blocking pipe under the stream:
        a write to it would block on a reader that takes nothing, past the
        stop; else None."""
        if self._stop is None or not self._wait:
            return None
        fd = plain_descriptor(self._stream)
        try:
            return fd if fd is not None and stat.S_ISFIFO(os.fstat(fd).st_mode) else None
        except OSError:
            return None  # the stream's own write then says what is wrong

    def _write_through_waiting(self, fd: int, data: bytes, *, blocking: bool = False) -> None:
        """:meth:`write_through` to the non-blocking (or, with a stop, a blocking
        pipe's) ``fd``, not a regular file."""
        try:
            self._write_waiting(fd, data, counted=True, blocking=blocking)
        except OutputStopped:
            raise  # the reader is there, and reads what the descriptor took
        except Exception:
            self.arrived = 0  # a reader that has gone never reads what the pipe holds
            raise

    def _flushed_fd(self) -> int | None:
        """The descriptor of a binary file object of Python's own over a regular
        file (see :func:`plain_descriptor`), its buffer pushed out first; None
        for any other stream."""
        if self._text:
            return None
        fd = plain_descriptor(self._stream)
        try:
            if fd is None or not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
        except OSError:
            return None
        if hasattr(self._stream, "flush"):
            self._stream.flush()
        return fd

    def flush(self) -> None:
        """Push buffered lines to the stream's destination; raise on failure."""
        with self._lock:
            if self._err is not None:
                raise self._err.with_traceback(None)
            if not hasattr(self._stream, "flush"):
                return
            try:
                fd = self._nonblocking_fd() if self._wait else None
                if fd is not None:
                    self._flush_waiting(fd)
                else:
                    self._stream.flush()
            except Exception as exc:
                self._err = exc
                raise


def _descriptor(stream: Any) -> int | None:
    """The descriptor under ``stream``, or None (no ``fileno``, or closed)."""
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, TypeError, ValueError):
        return None


def plain_descriptor(stream: Any) -> int | None:
    """The descriptor under ``stream`` when bytes written to it reach that
    descriptor unchanged: the stream (or, for a text stream, its binary
    ``buffer``) is a file object of Python's own (``open()``, ``sys.stdout``,
    ``socket.makefile()`` of a plain socket); else None. A compressor
    (``gzip.open``, ``bz2``, ``lzma``) answers ``fileno()`` with the descriptor
    of the file underneath, and a TLS socket's file with the TCP socket's:
    bytes written there would skip the compression, or go out unencrypted."""
    inner = stream._buffer if isinstance(stream, _UTF8UnderText) else stream
    if _is_text(inner):
        inner = getattr(inner, "buffer", None)
    if type(inner) in (io.BufferedWriter, io.BufferedRandom):
        inner = getattr(inner, "raw", None)  # a buffer over a raw stream of some other kind
    if type(inner) is socket.SocketIO:
        if type(getattr(inner, "_sock", None)) is not socket.socket:  # ssl.SSLSocket, ...
            return None
    elif type(inner) is not io.FileIO:
        return None
    return _descriptor(stream)


def _wait_writable(fd: int, stop: threading.Event | None = None,
                   deadline: float | None = None) -> None:
    """Block until ``fd`` can take bytes, or has an error the next write reports
    (a reader that has gone: EPIPE); raise :class:`OutputStopped` once ``stop``
    is set, or the ``deadline`` (``time.monotonic``) passed, while ``fd`` is
    still full. A reader that has gone is seen before the stop, so a closed
    pipe is never taken for a stop."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    if stop is None and deadline is None:
        poller.poll()
        return
    while not poller.poll(_STOP_POLL_MS):
        if (stop is not None and stop.is_set()) or (
                deadline is not None and time.monotonic() >= deadline):
            raise OutputStopped


def check_stream(stream: Any, made_by: str, error: type[Exception] | None = None) -> None:
    """Refuse, when a writer of records is made, what no line could be written
    to: a path, or a closed file, passed by mistake. ``error`` is raised with
    the sentence; by default a TypeError or a ValueError."""
    if not callable(getattr(stream, "write", None)):
        hint = (": open the file first, such as open(path, 'ab')"
                if isinstance(stream, (str, bytes, os.PathLike)) else "")
        raise (error or TypeError)(f"{made_by} needs a stream with write(), such as "
                                   f"sys.stdout.buffer; it was given {described(stream)}{hint}")
    if getattr(stream, "closed", False) is True:
        raise (error or ValueError)(f"{made_by} was given a closed stream "
                                    f"({described(stream)}): pass one that is open for writing")
    # A file opened for reading says so in its mode ('r', 'rb'); writable() is
    # no test: io.IOBase's default is False, and a consumer's write-only
    # subclass (a stream to logging) inherits it while write() works.
    mode = getattr(stream, "mode", None)
    if isinstance(mode, str):
        reads_only = bool(mode) and not set(mode) & set("wax+")
    else:  # no mode, or not a string (gzip.GzipFile's is 1 or 2 before Python 3.12):
        # writable() says, where the class says it itself (not io.IOBase's default)
        writable = getattr(type(stream), "writable", None)
        reads_only = False
        if callable(writable) and writable is not io.IOBase.writable:
            with contextlib.suppress(OSError, ValueError):  # the first write says it
                reads_only = stream.writable() is False
    if reads_only:
        raise (error or ValueError)(
            f"{made_by} was given a stream opened for reading only ({described(stream)}): "
            "open it for writing, such as open(path, 'ab')")


def _observer(
    stream: IO[bytes] | IO[str], render: Callable[[Event], bytes | str], made_by: str
) -> tuple[Observer, Callable[[], Exception | None]]:
    # The observer swallows write failures: a stream no line can reach would
    # trace nothing and say nothing. None passes: it is what Python makes of a
    # standard stream the caller closed (``2>&-``), and a program must not
    # stop for want of its trace.
    if stream is not None:
        check_stream(stream, f"agentrt: {made_by}")
    out = LineWriter(stream, wait=True)  # a full non-blocking pipe is waited out
    write = out.write
    unrendered: list[Exception] = []

    def observe(event: Event) -> None:
        # An observer must not break the run it watches; the failure is
        # reported by the err function instead.
        try:
            line = render(event)
        except Exception as exc:  # noqa: BLE001 - this event writes nothing; noted
            if not unrendered:
                unrendered.append(exc)
            return
        with contextlib.suppress(Exception):  # remembered; err() reports it
            write(line)

    def err() -> Exception | None:
        return out.err() or (unrendered[0] if unrendered else None)

    return observe, err


def writer_with_err(
    stream: IO[bytes] | IO[str],
) -> tuple[Observer, Callable[[], Exception | None]]:
    """:func:`writer` plus a function returning the first write failure."""
    return _observer(stream, aligned_line, "trace.writer")


def writer(stream: IO[bytes] | IO[str]) -> Observer:
    """An observer printing one aligned, sanitized line per event (flushed).

    A full non-blocking stream is waited out, so a slow reader misses nothing.
    The first failure (a reader that has gone) ends the trace silently, as
    the Go reference's ``Writer`` does: :func:`writer_with_err` reports it."""
    return writer_with_err(stream)[0]


def jsonl_with_err(
    stream: IO[bytes] | IO[str],
) -> tuple[Observer, Callable[[], Exception | None]]:
    """:func:`jsonl` plus a function returning the first write failure."""
    return _observer(stream, jsonl_record, "trace.jsonl")


def jsonl(stream: IO[bytes] | IO[str]) -> Observer:
    """An observer writing :func:`jsonl_record` per event (flushed).

    Waits and fails as :func:`writer` does; :func:`jsonl_with_err` reports
    the failure."""
    return jsonl_with_err(stream)[0]
