"""How the ``agentrt`` command prints the view: aligned tables, the approval block,
indented JSON, and text clipped to what a terminal line can hold.

Everything a database holds may have been written by an agent, a tool or
whoever handed the file over, so every stored string shown as text passes
through :func:`agentrt.trace.sanitize` here: nothing in it can move the
cursor, reorder a line or hide characters. JSON output needs no such care,
since its strings are escaped.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from agentrt import timefmt
from agentrt.gojson import is_valid, raw_members
from agentrt.records import Approval, Reason
from agentrt.timefmt import ZERO_TIME
from agentrt.trace import display_width, is_mark, pad, sanitize
from agentrt.view import RunSummary, StepSummary, bound_raw, bound_string
from agentrt.view.bounding import bound_keys

__all__ = [
    "CELL_BYTES",
    "GOAL_COLUMN_BYTES",
    "PAYLOAD_BYTES",
    "RUNS_HEADER",
    "STEPS_HEADER",
    "TEXT_FIELD_BYTES",
    "Table",
    "approval_block",
    "approval_expired",
    "cap_payload",
    "clip_bytes",
    "clip_cell",
    "clip_goal",
    "indent_json",
    "lease_line",
    "local_stamp",
    "run_header",
    "run_row",
    "step_row",
    "trailer",
]

#: A text field (goal, detail, summary, reason) shown in full up to this many bytes.
TEXT_FIELD_BYTES = 4000
#: An event payload in the aligned trace line, up to this many bytes.
PAYLOAD_BYTES = 8000
#: The goal column of ``agentrt runs``.
GOAL_COLUMN_BYTES = 60
#: Any other table cell (an id, a status, a tool): a table pads every row to its
#: column's widest cell, so one oversized cell would widen every line.
CELL_BYTES = 80

RUNS_HEADER = ("RUN", "STATUS", "REASON", "STEPS", "CREATED", "APPROVAL", "GOAL")
STEPS_HEADER = ("STEP", "TOOL", "DECISION", "STATUS", "POLICY", "OBSERVATION", "SUMMARY")

# What a page read leaves at the end of a text column it cut.
_PAGE_MARKER = re.compile(r"…\[truncated: \d+ characters\]\Z")


def _cut(data: bytes, limit: int) -> int:
    """The largest character boundary at or below ``limit``."""
    i = min(limit, len(data))
    while 0 < i < len(data) and data[i] & 0xC0 == 0x80:
        i -= 1
    return i


def _head(text: str, data: bytes, limit: int) -> str:
    """The start of ``text`` (``data`` is its UTF-8) within ``limit`` bytes that
    cuts no character in two: no UTF-8 sequence, and no letter from the
    combining marks drawn over it (an "é" written e + U+0301 goes whole or not
    at all)."""
    n = len(data[:_cut(data, limit)].decode("utf-8", "surrogatepass"))
    while 0 < n < len(text) and is_mark(text[n]):
        n -= 1
    return text[:n]


def clip_bytes(text: str, limit: int = TEXT_FIELD_BYTES) -> str:
    """``text`` cut to ``limit`` UTF-8 bytes on a character boundary, plus
    ``...[N more bytes]``. A text a page read already cut keeps that read's
    marker instead, because it gives the full length, which this cut cannot."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    head = _head(text, data, limit)
    marker = _PAGE_MARKER.search(text)
    if marker is not None:
        return head + marker.group()
    return f"{head}...[{len(data) - len(head.encode('utf-8', 'surrogatepass'))} more bytes]"


def clip_cell(text: str, limit: int = CELL_BYTES) -> str:
    """``text`` for one table cell: sanitized (newlines become spaces), cut to
    ``limit`` bytes with ``…``. The byte cap bounds the cell's width too: no
    character is wider on a terminal than its UTF-8 length."""
    text = sanitize(text)
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return _head(text, data, limit) + "…"


def clip_goal(goal: str, limit: int = GOAL_COLUMN_BYTES) -> str:
    """A goal for one table cell (:func:`clip_cell`), cut to ``limit`` bytes."""
    return clip_cell(goal, limit)


def _field(text: str) -> str:
    """A stored text on a line of its own, sanitized and cut to ``TEXT_FIELD_BYTES``."""
    return sanitize(clip_bytes(text))


def cap_payload(payload: bytes, limit: int = PAYLOAD_BYTES) -> bytes:
    """A payload for the aligned trace line: its head up to ``limit`` bytes and
    ``...[N more bytes]``."""
    if len(payload) <= limit:
        return payload
    end = _cut(payload, limit)
    return payload[:end] + b"...[%d more bytes]" % (len(payload) - end)


def local_stamp(t: datetime | None) -> str:
    """``2006-01-02 15:04:05 -0700`` in the local zone; ``-`` for no time."""
    if t is None or t == ZERO_TIME:
        return "-"
    return timefmt.local_stamp(t)


def _dash(text: str) -> str:
    return clip_cell(text) if text else "-"


# -- tables ------------------------------------------------------------------


@dataclass
class Table:
    """Columns aligned as Go's tabwriter aligns them (two spaces of padding, the
    last column left ragged), one page of rows at a time. Widths are terminal
    columns, not characters, so wide (CJK, emoji) and combining characters
    keep the columns straight.

    A listing read in pages is printed page by page so memory stays bounded;
    a column only ever widens, so the pages line up as long as no later cell
    is wider than every earlier one.
    """

    header: Sequence[str]
    widths: list[int] = field(default_factory=list)
    _started: bool = False

    def page(self, rows: Sequence[Sequence[str]]) -> list[str]:
        """The lines for ``rows`` (preceded by the header the first time)."""
        block = [list(self.header)] if not self._started else []
        block += [list(r) for r in rows]
        self._started = True
        columns = len(self.header) - 1
        if not self.widths:
            self.widths = [0] * columns
        for row in block:
            for i in range(columns):
                self.widths[i] = max(self.widths[i], display_width(row[i]))
        return [
            ("".join(pad(c, w + 2) for c, w in zip(row[:-1], self.widths, strict=True))
             + row[-1]).rstrip()
            for row in block
        ]


def run_row(s: RunSummary) -> list[str]:
    return [
        clip_cell(s.id),
        clip_cell(s.status),
        _dash(s.reason),
        clip_cell(str(s.steps)),
        local_stamp(s.created_at),
        _dash(s.pending_approval_id),
        clip_goal(s.goal),
    ]


def step_row(s: StepSummary) -> list[str]:
    summary = s.summary
    if s.decode_error:
        summary = f"{summary} [unread: {s.decode_error}]".lstrip()
    return [
        clip_cell(str(s.index)),
        _dash(s.tool),
        _dash(s.decision),
        _dash(s.status),
        _dash(s.policy),
        _dash(s.observation),
        _field(summary) if summary else "",
    ]


def trailer(noun: str, offset: int, shown: int, total: int) -> str | None:
    """``... N more <noun>(s); rerun with --offset X to see them (showing n of total)``,
    or None when nothing lies beyond the page."""
    more = total - offset - shown
    if more <= 0:
        return None
    return (f"... {more} more {noun}(s); rerun with --offset {offset + shown} to see them "
            f"(showing {shown} of {total})")


def skipped_line(noun: str, offset: int, total: int) -> str | None:
    """``... N <noun>(s) before --offset X; rerun without it to see them``, or None
    when the page starts at the first: what an offset hides from a page read
    alongside another (a run's pending approvals paged with its steps)."""
    before = min(offset, total)
    if before <= 0:
        return None
    return f"... {before} {noun}(s) before --offset {offset}; rerun without it to see them"


# -- the run header --------------------------------------------------------------


def _dollars(micros: int) -> str:
    return f"${micros / 1_000_000:.4f}"


def lease_line(owner: str, expires: datetime | None, now: datetime) -> str:
    """Who holds a running run's lease and until when, ``expired`` once that
    time has passed by ``now``: an expired lease is a run no process is
    executing any more, which a resume takes over."""
    if not owner and expires is None:
        return "lease   none: no process holds this run"
    line = f"lease   {_field(owner) if owner else '-'}"
    if expires is None:
        return f"{line} (no readable expiry)"
    line += f" until {local_stamp(expires)}"
    return f"{line} (expired)" if expires <= now else line


def run_header(s: RunSummary, lease: str | None = None) -> list[str]:
    """The lines above a run's approvals and steps in ``agentrt show``;
    ``lease`` (a :func:`lease_line`) follows the status."""
    status = _field(s.status)
    if s.reason:
        status += f" ({_field(s.reason)})"
    if s.reason_detail:
        status += f": {_field(s.reason_detail)}"
    # Both stamps always, as spec 15 pins the line: a run not finished shows ``-``.
    stamps = f"created {local_stamp(s.created_at)}  finished {local_stamp(s.finished_at)}"
    lines = [
        f"run     {_field(s.id)}",
        f"goal    {_field(s.goal)}",
        f"status  {status}",
        *([lease] if lease is not None else []),
        f"steps   {s.steps}",
        stamps,
    ]
    if s.model_calls > 0:
        lines.append(
            f"model   {s.model_calls} call(s), {s.usage.input_tokens} in, "
            f"{s.usage.output_tokens} out, estimated {_dollars(s.estimated_cost_micros)}")
    return lines


# -- JSON --------------------------------------------------------------------

_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\],:]|[^"{}\[\],:\s]+|\s+', re.DOTALL)


def indent_json(data: bytes, level: int = 0) -> bytes:
    """Valid JSON re-indented two spaces a level, as Go's ``MarshalIndent`` writes
    it (``{}`` and ``[]`` stay on one line; strings and numbers untouched).
    ``level`` is the depth the value starts at, for a value inside a document."""
    out: list[bytes] = []
    depth = level
    tokens = _TOKEN.findall(data)
    i, n = 0, len(tokens)
    while i < n:
        t = tokens[i]
        if t == b"{" or t == b"[":
            close = b"}" if t == b"{" else b"]"
            j = i + 1
            while j < n and tokens[j].isspace():
                j += 1
            if j < n and tokens[j] == close:
                out.append(t + close)
                i = j + 1
                continue
            depth += 1
            out.append(t + b"\n" + b"  " * depth)
        elif t == b"}" or t == b"]":
            depth -= 1
            out.append(b"\n" + b"  " * depth + t)
        elif t == b",":
            out.append(b",\n" + b"  " * depth)
        elif t == b":":
            out.append(b": ")
        elif not t.isspace():
            out.append(t)
        i += 1
    return b"".join(out)


# -- the approval block --------------------------------------------------------


def _fields(raw: bytes) -> list[tuple[str, bytes]] | str:
    """An object's members, ``(none)``, ``(no fields)``, or a non-object as ``value``."""
    if not raw.strip() or raw.strip() == b"null":
        return "(none)"
    try:
        members = raw_members(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return [("value", raw)]
    if not members:
        return "(no fields)"
    return list(members.items())


def _field_lines(raw: bytes) -> list[str]:
    fields = _fields(raw)
    if isinstance(fields, str):
        return [f"  {fields}"]
    lines: list[str] = []
    keys = bound_keys(key for key, _ in fields)
    for key, (_, value) in zip(keys, fields, strict=True):
        lines.append(f"  {sanitize(key)} ({len(value)} bytes)")
        shown = bound_raw(value)
        if is_valid(shown):
            text = indent_json(shown).decode("utf-8", "replace")
        else:
            text = bound_string(shown.decode("utf-8", "replace"))
        lines.extend(f"    {sanitize(line)}" for line in text.split("\n"))
    return lines


def approval_expired(a: Approval, now: datetime) -> bool:
    """Whether ``a`` is past its expiry by ``now``, as a decision judges it: it is
    still stored pending, but deciding it now expires it and cancels the run."""
    return a.expires_at is not None and now > a.expires_at


def approval_block(a: Approval, *, now: datetime, reason: str = "",
                   db_path: str = "") -> list[str]:
    """The request an operator decides on, every field of it, bounded for showing.

    ``hash`` is what a decision made after reading this block is bound to.
    ``db_path`` adds the command that decides it, unless the approval is past
    its expiry by ``now``: that command could only cancel the run.
    """
    expired = approval_expired(a, now)
    name = a.request.spec.name if a.request is not None else ""
    tool = _field(name) if name else "-"
    lines = [
        f"APPROVAL WAITING  {_field(a.id)}",
        f"kind    {_field(a.kind)}",
        f"tool    {tool}",
    ]
    if reason:
        lines.append(f"reason  {_field(reason)}")
    if a.expires_at is not None:
        lines.append(f"expires {local_stamp(a.expires_at)}" + (
            f" (expired: deciding it now cancels the run as {Reason.APPROVAL_EXPIRED.value})"
            if expired else ""))
    if a.decode_error:
        lines.append(f"unread  {_field(a.decode_error)}")
    lines.append(f"hash    {_field(a.hash)}")
    lines.append("arguments:")
    lines.extend(_field_lines(a.request.args if a.request is not None else b""))
    lines.append("presentation:")
    lines.extend(_field_lines(a.presentation))
    # An id too long to show whole, or one the terminal would be shown escaped
    # (a tab, a zero-width joiner), would make a command that names nothing.
    if (db_path and not expired and sanitize(db_path) == db_path
            and all(clip_bytes(v) == v and sanitize(v) == v for v in (a.run_id, a.id))):
        run, approval = shlex.quote(a.run_id), shlex.quote(a.id)
        # A run id that starts with '-' would be read as an option before '--'.
        ids = (f"--approval {approval} -- {run}" if a.run_id.startswith("-")
               else f"{run} --approval {approval}")
        lines.append(f"decide with: agentrt --db {shlex.quote(db_path)} approve {ids}")
    lines.append(f"----- end of approval {_field(a.id)} for tool {tool} -----")
    return lines
