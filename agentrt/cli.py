"""``agentrt``: the operator command, a thin renderer over :mod:`agentrt.view`.

It is what the runtime ships instead of a UI: list runs, show one, replay its
events, approve, reject or cancel, and re-check the event chain, in aligned
text or ``--json``, against ``--db PATH`` or ``AGENTRT_DB``. The database is
opened as it is (never created, never migrated): read-only for reading, and
``runs``, ``show`` and ``events`` read only through page reads, so neither a
huge table nor a huge row costs more than a page. Every argument is checked
before the database is opened. Exit codes: 0 ok, 1 failure (``error: ...``),
2 usage (``usage: ...``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, Generic, TypeVar, cast

import apsw
import click

from agentrt import view
from agentrt.clitools import OUTPUT_CLOSED, Count, run_click, schema_sentence, silence_stdout
from agentrt.errors import AgentrtError, ApprovalChangedError, SchemaVersionError
from agentrt.events import Observer
from agentrt.gojson import dumps, encode_string
from agentrt.records import Approval, ApprovalStatus, RunStatus
from agentrt.render import (
    RUNS_HEADER,
    STEPS_HEADER,
    Table,
    approval_block,
    approval_expired,
    cap_payload,
    indent_json,
    lease_line,
    run_header,
    run_row,
    skipped_line,
    step_row,
    trailer,
)
from agentrt.store import Store, open_existing
from agentrt.store.opening import sqlite_failure
from agentrt.trace import aligned_line, jsonl_record, sanitize, writer

__all__ = ["cli", "main"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: Rows read at a time, whatever ``--limit`` asks for (``--limit 0``: all of them).
PAGE_SIZE = 500

#: The largest count, offset or seq an option takes: SQLite's integers are 64-bit.
MAX_INT = 2**63 - 1

_NO_RESUME = (
    "there is no resume command: resuming continues the run's loop, which needs the "
    "consumer's agent, tools and policy, so the consumer that owns them resumes it"
)
_NO_RECHECK = (
    "there is no recheck command: rechecking a run asks its policy again, which only "
    "the consumer that owns it holds; verify checks the event chain"
)


# -- shared options, declared once ---------------------------------------------


def output_options(fn: F) -> F:
    """``--db`` and ``--json``: accepted before the command and after it."""
    fn = click.option("--json", "as_json", is_flag=True,
                      help="Print JSON instead of aligned text.")(fn)
    fn = click.option("--db", metavar="PATH",
                      help="The database (default: $AGENTRT_DB). Opened as it is: "
                           "never created, never migrated.")(fn)
    return fn


def page_options(default_limit: int) -> Callable[[F], F]:
    """``--limit`` and ``--offset`` for a listing read in pages."""

    def decorate(fn: F) -> F:
        fn = click.option("--offset", type=Count(min=0, max=MAX_INT), default=0,
                          metavar="N", help="Skip this many first.")(fn)
        fn = click.option("--limit", type=Count(min=0, max=MAX_INT),
                          default=default_limit,
                          show_default=True, metavar="N",
                          help=f"Show at most N (0: all, read {PAGE_SIZE} at a time).")(fn)
        return fn

    return decorate


def decision_options(fn: F) -> F:
    """``--by`` and ``--note``, recorded with a decision."""
    fn = click.option("--note", default="", metavar="TEXT",
                      help="Why; recorded with the decision.")(fn)
    fn = click.option("--by", metavar="WHO",
                      help="Who decides (default: $USER); recorded with the decision.")(fn)
    return fn


@dataclass(frozen=True)
class Settings:
    """Where to read and how to print, resolved once: the command's own option,
    then the one given before the command, then ``AGENTRT_DB``."""

    db: str
    as_json: bool


def settings(db: str | None, as_json: bool) -> Settings:
    outer = click.get_current_context().find_root().obj or {}
    given = db if db is not None else outer.get("db")
    if given is not None and not given:
        # ``--db "$DB"`` with $DB unset: not a reason to use the database named elsewhere.
        raise click.UsageError("--db is empty: name the database file, e.g. --db ops.db")
    path = given or os.environ.get("AGENTRT_DB") or ""
    if not path:
        raise click.UsageError("no database: pass --db or set AGENTRT_DB")
    return Settings(path, as_json or bool(outer.get("as_json")))


def named_run(run_id: str) -> None:
    """Refuse an empty RUN before the database is opened: ``agentrt show "$RUN"``
    with $RUN unset names no run, and "not found: run " would say nothing."""
    if not run_id:  # a blank one may name a run: the spec refuses only an empty id
        raise click.UsageError("RUN is empty: name the run, as agentrt runs prints it")


def operator_name(by: str | None) -> str:
    """Who decides: ``--by``, which must name someone, else ``$USER`` unless blank."""
    if by is not None:
        if not by.strip():
            raise click.UsageError("--by is blank: name who decides, e.g. --by alice")
        return by
    who = os.environ.get("USER") or ""
    if not who.strip():
        raise click.UsageError("no name to record the decision under: pass --by or set USER")
    try:
        who.encode("utf-8")
    except UnicodeEncodeError:
        raise click.UsageError("$USER is not valid UTF-8: pass --by or set USER in UTF-8"
                               ) from None
    return who


# -- opening and failing ---------------------------------------------------------


def fail(exc: BaseException, echoed: Iterable[str] = ()) -> click.ClickException:
    """One sentence for an expected failure; the text is the database's, so sanitized,
    and the ``echoed`` values it quotes (the ids typed) are cut as :func:`view.echo` cuts."""
    return click.ClickException(sanitize(view.echo_in(str(exc), echoed)))


@contextmanager
def opened(s: Settings, *, write: bool = False, echoed: Sequence[str] = ()) -> Iterator[Store]:
    """The database opened read-only (or read-write to decide), failures as sentences;
    ``echoed`` are the ids the command was given, cut when an error quotes them."""
    try:
        store = open_existing(s.db, read_only=not write)
    except SchemaVersionError as exc:
        raise click.ClickException(sanitize(schema_sentence(s.db, exc))) from None
    except AgentrtError as exc:
        raise fail(exc) from None
    try:
        yield store
    except AgentrtError as exc:
        raise fail(exc, echoed) from None
    except apsw.Error as exc:
        said = sqlite_failure(s.db, exc, write=write)
        raise click.ClickException(sanitize(
            said or f"{'using' if write else 'reading'} {s.db}: {exc}")) from None
    except ValueError as exc:  # a stored value that does not decode: a damaged row
        raise click.ClickException(sanitize(view.echo_in(
            f"{s.db} holds a value that does not decode ({exc}), so nothing was changed; "
            "agentrt show and events read what is stored", echoed))) from None
    finally:
        store.close()


# -- output --------------------------------------------------------------------


def binary(stream: IO[str]) -> IO[bytes]:
    """The bytes beneath a text stream (click's test runner swaps in its own)."""
    return cast(IO[bytes], getattr(stream, "buffer", stream))


class Out:
    """Stdout as bytes: JSON is written exactly as encoded, text as UTF-8.

    A closed stdout (``>&-``: Python has no ``sys.stdout`` then) fails the first
    write with an OSError, as a full disk does, rather than an AttributeError.
    """

    def __init__(self) -> None:
        self.stream: IO[bytes] | None = (
            binary(sys.stdout) if sys.stdout is not None else None)

    def _stream(self) -> IO[bytes]:
        if self.stream is None:
            raise OSError(errno.EBADF, OUTPUT_CLOSED)
        return self.stream

    def line(self, text: str = "") -> None:
        self._stream().write(text.encode("utf-8", "replace") + b"\n")

    def raw(self, data: bytes) -> None:
        self._stream().write(data)

    def flush(self) -> None:
        self._stream().flush()


def tell(text: str) -> None:
    """A line for the person on stderr, beside output that must stay as it is.

    Only a note: a stderr that is closed (``2>&-``: Python has no ``sys.stderr``
    then) or cannot take it (a full disk) must not fail a listing already
    written whole, so the note is dropped then.
    """
    if sys.stderr is None:
        return
    with suppress(OSError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def _empty_page(noun: str, pages: Pages[Any]) -> None:
    """Say on stderr that an offset skipped everything, as ``runs`` says it."""
    if not pages.returned and pages.offset:
        tell(f"no {noun} at offset {pages.offset}; there are {pages.total}")


class Array:
    """A JSON array member written as its items arrive (a listing read in pages)."""

    def __init__(self, items: Iterable[Any]) -> None:
        self.items = items


#: A member left out of a JSON object (Go's omitempty).
OMIT = object()


def _json(value: Any, level: int) -> bytes:
    return indent_json(dumps(value, html=False), level)


def write_object(out: Out, members: Sequence[tuple[str, Any]]) -> None:
    """An indented JSON object whose members may be arrays streamed page by page and
    values computed only once the arrays before them are written (a callable)."""
    out.raw(b"{")
    first = True
    for key, value in members:
        if callable(value):
            value = value()
        if value is OMIT:
            continue
        out.raw((b"\n  " if first else b",\n  ") + encode_string(key, False).encode() + b": ")
        first = False
        if isinstance(value, Array):
            count = 0
            for item in value.items:
                out.raw((b"[\n    " if count == 0 else b",\n    ") + _json(item, 2))
                count += 1
            out.raw(b"\n  ]" if count else b"[]")
        else:
            out.raw(_json(value, 1))
    out.raw(b"\n}\n")


def write_document(out: Out, value: Any) -> None:
    out.raw(_json(value, 0) + b"\n")


#: Reads of one page again while rows keep arriving on top: a consumer starting
#: runs faster than a page reads gets, past this, a row listed twice rather
#: than a listing that never ends.
_REREADS = 8


class Pages(Generic[T]):
    """A listing read ``PAGE_SIZE`` rows at a time, up to ``limit`` (0: all).

    The total is the first page's count; reading stops there, so rows a live
    consumer adds meanwhile do not keep it going. A ``newest_first`` listing
    (runs) gets those rows on top, where they push every older row down: each
    page's own count says by how many, and the next page's offset moves down
    as far, so no row is read twice and none is pushed out of reach. A listing
    rows can leave (pending approvals) reads each page after the last row
    shown, given ``after``, so a row that leaves meanwhile skips none.
    """

    def __init__(self, fetch: Callable[[int, int], tuple[list[T], int]], limit: int,
                 offset: int, first: tuple[list[T], int] | None = None, *,
                 newest_first: bool = False,
                 after: Callable[[int, int, T], list[T]] | None = None) -> None:
        self._fetch = fetch
        self.limit = limit
        self.offset = offset
        self._newest_first = newest_first
        self._after = after
        self._first, self.total = first if first is not None else fetch(
            page_size(limit), offset)
        self.returned = 0

    def pages(self) -> Iterator[list[T]]:
        # ``at`` and ``end`` are positions in the listing as it stands now: rows
        # added on top since the first page move both down by as many.
        items, at, end = self._first, self.offset, self.total
        while items:
            if self.limit:
                items = items[: self.limit - self.returned]
            self.returned += len(items)
            yield items
            at += len(items)
            if (self.limit and self.returned >= self.limit) or at >= end:
                return
            size = min(PAGE_SIZE, self.limit - self.returned) if self.limit else PAGE_SIZE
            if self._after is not None:
                items = self._after(size, at, items[-1])
                continue
            items, now = self._fetch(size, at)
            for _ in range(_REREADS):
                if not self._newest_first or now <= end:
                    break
                at, end = at + now - end, now
                items, now = self._fetch(size, at)

    def __iter__(self) -> Iterator[T]:
        for page in self.pages():
            yield from page

    @property
    def more(self) -> int:
        """Rows beyond what was returned."""
        return max(0, self.total - self.offset - self.returned)


def page_size(limit: int) -> int:
    return min(limit, PAGE_SIZE) if limit else PAGE_SIZE


def _table(out: Out, header: Sequence[str], pages: Pages[Any],
           row: Callable[[Any], Sequence[str]]) -> None:
    """Every page as aligned table lines, one page in memory at a time."""
    table = Table(header)
    for page in pages.pages():
        for line in table.page([row(item) for item in page]):
            out.line(line)


def _trail(out: Out, noun: str, pages: Pages[Any]) -> None:
    line = trailer(noun, pages.offset, pages.returned, pages.total)
    if line is not None:
        out.line(line)


# -- the command ---------------------------------------------------------------


class _ParsedWithContext(click.Command):
    """A command whose option parser's usage errors (``--limit`` with no value)
    carry its context, so its usage line follows them as it follows every other
    usage error; click raises them without one."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if exc.ctx is not None:
                raise
            raise click.UsageError(exc.message, ctx) from None


class _Commands(_ParsedWithContext, click.Group):
    """Commands listed in the order an operator uses them; ``resume`` and
    ``recheck`` answered with why they are not here; a closed pipe is not a failure."""

    command_class = _ParsedWithContext

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def invoke(self, ctx: click.Context) -> Any:
        # A reader that went away (``| head``) ends the listing quietly with 0;
        # click would turn the broken pipe into exit 1.
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            silence_stdout()
            raise click.exceptions.Exit(0) from None

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[
            str | None, click.Command | None, list[str]]:
        if args and args[0] == "resume":
            raise click.UsageError(_NO_RESUME, ctx)
        if args and args[0] == "recheck":
            raise click.UsageError(_NO_RECHECK, ctx)
        return super().resolve_command(ctx, args)


@click.group(cls=_Commands, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "-help", "--help"]})
@output_options
@click.pass_context
def cli(ctx: click.Context, db: str | None, as_json: bool) -> None:
    """Inspect an agentrt database and decide on its runs.

    \b
    The database comes from --db or AGENTRT_DB. It is opened as it is, never
    created or migrated: read-only for runs, show, events and verify, which
    read a page at a time however large the database is.

    \b
    There is no resume command: resuming continues the run's loop, which
    needs the consumer's agent, tools and policy, so resuming belongs to the
    consumer that owns them. An approved run stays waiting until it does.

    Exit codes: 0 ok, 1 failure, 2 usage.
    """
    ctx.obj = {"db": db, "as_json": as_json}
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help(), err=True)
        ctx.exit(2)


@cli.command()
@page_options(100)
@output_options
def runs(limit: int, offset: int, db: str | None, as_json: bool) -> None:
    """List runs, newest first, with the approval each waits on."""
    s = settings(db, as_json)
    out = Out()
    with opened(s) as store:
        pages = Pages(lambda n, at: view.runs_page(store, n, at), limit, offset,
                      newest_first=True)
        if s.as_json:
            write_object(out, [
                ("runs", Array(r.to_json() for r in pages)),
                ("total", pages.total),
                ("limit", limit),
                ("offset", offset),
                ("truncated", lambda: True if pages.more else OMIT),
            ])
            return
        if pages.total == 0:
            out.line("no runs")
            return
        _table(out, RUNS_HEADER, pages, run_row)
        if not pages.returned:
            out.line(f"no runs at offset {offset}; there are {pages.total}")
        _trail(out, "run", pages)


def _reason(store: Store, a: Approval) -> str:
    return store.approval_reasons(a.run_id, [a.id]).get(a.id, "")


@cli.command()
@click.argument("run_id", metavar="RUN")
@page_options(500)
@output_options
def show(run_id: str, limit: int, offset: int, db: str | None, as_json: bool) -> None:
    """Show a run: its state, the approval it waits on, and its steps."""
    named_run(run_id)
    s = settings(db, as_json)
    out = Out()
    with opened(s, echoed=(run_id,)) as store:
        page = view.detail_page(store, run_id, page_size(limit), offset)
        # A run that is not waiting waits on no approval: one it left pending (cancel
        # leaves it so) cannot be decided, so it is not offered.
        waits = page.run.status == RunStatus.WAITING_FOR_APPROVAL
        waiting = page.waiting
        now = datetime.now(UTC)
        steps = Pages(lambda n, at: view.steps_page(store, run_id, n, at), limit, offset,
                      first=(page.steps, page.steps_total))
        if s.as_json:
            approvals = Pages(lambda n, at: store.list_approvals_page(run_id, "", n, at),
                              limit, offset, first=(page.approvals, page.approvals_total))
            write_object(out, [
                ("run", page.run.to_json()),
                ("steps", Array(st.to_json() for st in steps)),
                ("steps_total", page.steps_total),
                ("steps_truncated", lambda: True if steps.more else OMIT),
                ("approvals", Array(view.approval_json(a) for a in approvals)
                 if page.approvals else OMIT),
                ("approvals_total", page.approvals_total),
                ("waiting_approval", view.approval_json(waiting)
                 if waiting is not None else OMIT),
                # As the text leaves out its ``decide with:``: deciding it cancels the run.
                ("waiting_approval_expired", True
                 if waiting is not None and approval_expired(waiting, now) else OMIT),
                ("limit", limit),
                ("offset", offset),
            ])
            out.flush()
            _empty_page("steps", steps)
            return
        lease = None
        if page.run.status == RunStatus.RUNNING:  # only a running run is held
            owner, expires = store.lease(run_id)
            # Read after the page: a run that ended meanwhile (its end clears
            # the lease) is not said to be a running run nobody holds.
            if owner or expires is not None or (
                    store.get_run_capped(run_id).status == RunStatus.RUNNING):
                lease = lease_line(owner, expires, now)
        for line in run_header(page.run, lease):
            out.line(line)
        pending: Pages[Approval] | None = None
        blocks: Iterable[list[Approval]] = []
        if waiting is not None:
            blocks = [[waiting]]
        elif waits:
            pending = Pages(
                lambda n, at: store.list_approvals_page(
                    run_id, ApprovalStatus.PENDING.value, n, at),
                limit, offset, first=(page.pending, page.pending_total),
                after=lambda n, at, last: store.list_approvals_page(
                    run_id, ApprovalStatus.PENDING.value, n, at, after_id=last.id)[0])
            blocks = pending.pages()
            skipped = skipped_line("pending approval", offset, pending.total)
            if skipped is not None:  # the steps' offset pages these too (spec 14)
                out.line()
                out.line(skipped)
        for shown in blocks:
            reasons = store.approval_reasons(run_id, [a.id for a in shown])
            for a in shown:
                out.line()
                for line in approval_block(a, now=now, reason=reasons.get(a.id, ""),
                                           db_path=s.db):
                    out.line(line)
        if pending is not None:
            _trail(out, "pending approval", pending)
        out.line()
        if steps.total == 0:
            out.line("no steps")
            return
        _table(out, STEPS_HEADER, steps, step_row)
        _trail(out, "step", steps)
        out.flush()
        _empty_page("steps", steps)


@cli.command()
@click.argument("run_id", metavar="RUN")
@page_options(500)
@output_options
def events(run_id: str, limit: int, offset: int, db: str | None, as_json: bool) -> None:
    """Replay a run's events: aligned lines, or --json JSON Lines.

    The same two renderings as the trace observers, so what an operator reads
    afterwards is what a live trace printed.
    """
    named_run(run_id)
    s = settings(db, as_json)
    out = Out()
    with opened(s, echoed=(run_id,)) as store:
        store.get_run_capped(run_id)
        pages = Pages(lambda n, at: store.list_events_page(run_id, n, at), limit, offset)
        if s.as_json:
            for event in pages:
                out.raw(jsonl_record(event))
            if pages.more:
                out.raw(b'{"meta":true,"truncated":true,"total":%d,"returned":%d,"offset":%d}\n'
                        % (pages.total, pages.returned, offset))
        else:
            for event in pages:
                out.raw(aligned_line(event._replace(payload=cap_payload(event.payload)))
                        .encode("utf-8", "replace"))
            _trail(out, "event", pages)
        out.flush()
        _empty_page("events", pages)


# -- decisions -----------------------------------------------------------------


def _interactive() -> bool:
    """Whether stdin is a terminal a person can answer at. Being a character
    device is not enough: /dev/null, /dev/zero and /dev/urandom are ones nobody
    types at (a line read from /dev/zero never ends)."""
    try:
        return os.isatty(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def _confirm(verb: str, a: Approval) -> bool | None:
    """Ask at the terminal; None when stdin ended before an answer (Ctrl-D, or a
    terminal that hung up), which is the refusal for want of consent (the
    spec's "EOF before an answer = same refusal"), not a typed no. Ctrl-C at the
    prompt is a failure that says nothing was decided (click's own "aborted"
    would leave the operator to wonder). A closed stderr (``2>&-``: Python has
    no ``sys.stderr`` then) cannot show the prompt, so no answer is asked for:
    the same refusal. An answer that is not valid UTF-8 is not y or yes: a no."""
    if sys.stderr is None:
        return None
    stderr = sys.stderr
    try:
        stderr.write(f"{verb} approval {sanitize(view.echo(a.id))} of run "
                     f"{sanitize(view.echo(a.run_id))}? [y/N] ")
        stderr.flush()
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            stderr.write("\n")
        raise click.ClickException(
            f"{verb}: interrupted at the prompt; nothing was decided") from None
    except OSError:  # the terminal hung up (EIO): no answer came, as at its end
        answer = ""
    except UnicodeDecodeError:  # typed, but not UTF-8 (a Latin-1 terminal's 'é')
        return False
    if not answer:
        with contextlib.suppress(OSError):  # a terminal that hung up takes no more
            stderr.write("\n")  # nothing typed was echoed: end the prompt's line
        return None
    return answer.strip().lower() in ("y", "yes")


def _refusal(verb: str) -> click.UsageError:
    return click.UsageError(
        f"{verb}: refusing without --approval, --yes, or an interactive terminal to "
        "confirm at; pass --approval <id> or --yes")


def _stderr_trace() -> Observer:
    return writer(binary(sys.stderr))


def _report_run(out: Out, summary: view.RunSummary) -> None:
    """``run <id>: <status> (<reason>)``, each cut as an error quotes it."""
    reason = f" ({sanitize(view.echo(summary.reason))})" if summary.reason else ""
    out.line(f"run {sanitize(view.echo(summary.id))}: "
             f"{sanitize(view.echo(summary.status))}{reason}")


def _write_result(out: Out, done: str, write: Callable[[], None]) -> None:
    """Print the result of a decision already committed: the one place a decision
    command writes it. A failure to write it (a full disk, a closed stdout) says
    that ``done`` stands, so nobody takes the decision for lost and makes it again;
    a reader that went away (a closed pipe) ends the command quietly, as for a listing.
    """
    try:
        write()
        out.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        if sys.stdout is not None:
            silence_stdout()  # the interpreter's last flush would fail again
        cause = exc.strerror or str(exc)
        raise click.ClickException(
            sanitize(f"{done}, but writing the result failed: {cause}")) from None


def _show_before_deciding(out: Out, verb: str, block: Iterable[str]) -> None:
    """Print the approval a decision will be bound to. What could not be shown
    is not decided: a reader that went away (a closed pipe) fails the command
    here, where for a listing or a result it ends it quietly."""
    try:
        for line in block:
            out.line(line)
        out.flush()
    except OSError as exc:
        if sys.stdout is not None:
            silence_stdout()
        cause = exc.strerror or str(exc)
        raise click.ClickException(
            f"{verb}: the approval could not be shown ({cause}), so nothing was decided; "
            "run it again with its output going where it can be read") from None


def _decide(verb: str, run_id: str, approval_id: str | None, yes: bool, by: str | None,
            note: str, db: str | None, as_json: bool) -> None:
    named_run(run_id)
    s = settings(db, as_json)
    who = operator_name(by)
    if approval_id is not None and not approval_id:
        # ``--approval "$ID"`` with $ID unset is not "the run's only approval".
        raise click.UsageError(
            "--approval is empty: name the approval to decide, as agentrt show prints it")
    ask = not approval_id and not yes
    if ask and (s.as_json or not _interactive()):
        raise _refusal(verb)
    out = Out()
    with opened(s, write=True, echoed=(run_id, approval_id or "")) as store:
        a = view.pending_approval(store, run_id, approval_id or "")
        if not s.as_json:
            _show_before_deciding(out, verb, approval_block(
                a, now=datetime.now(UTC), reason=_reason(store, a)))
        if ask:
            answer = _confirm(verb, a)
            if answer is None:
                raise _refusal(verb)
            if not answer:
                raise click.ClickException(f"{verb}: declined at the prompt")
        decide = view.approve_shown if verb == "approve" else view.reject_shown
        try:
            decided = decide(store, run_id, a.id, a.hash, who, note, observer=_stderr_trace())
        except ApprovalChangedError:
            raise click.ClickException(
                f"{verb}: approval {sanitize(view.echo(a.id))} changed after it was shown; "
                "run the command again and read it before deciding") from None
        summary = view.summary_capped(store, run_id)

    def write() -> None:
        if s.as_json:
            write_document(out, {"run": summary.to_json(),
                                 "approval": view.approval_json(decided)})
            return
        out.line(f"approval {sanitize(view.echo(decided.id))}: {sanitize(decided.status)} by "
                 f"{sanitize(decided.decided_by)}")
        _report_run(out, summary)
        if decided.status == ApprovalStatus.APPROVED:
            out.line("the run stays waiting until the consumer resumes it")

    done = f"approval {view.echo(decided.id)} was {decided.status}"
    if decided.status == ApprovalStatus.REJECTED and summary.status == RunStatus.CANCELLED:
        done += f" and run {view.echo(run_id)} cancelled"
    _write_result(out, done, write)


def approval_options(fn: F) -> F:
    """What ``approve`` and ``reject`` share: the run, the approval, the consent."""
    fn = output_options(fn)
    fn = decision_options(fn)
    fn = click.option("--yes", "-y", is_flag=True,
                      help="Decide the run's only pending approval without asking.")(fn)
    fn = click.option("--approval", "approval_id", metavar="ID",
                      help="The approval to decide (needed when there are several).")(fn)
    fn = click.argument("run_id", metavar="RUN")(fn)
    return fn


@cli.command()
@approval_options
def approve(run_id: str, approval_id: str | None, yes: bool, by: str | None, note: str,
            db: str | None, as_json: bool) -> None:
    """Grant the request a run waits on, after printing it.

    The decision is bound to the hash of what was printed: if the approval
    changed meanwhile, nothing is decided. At a terminal it asks first; in a
    script pass --approval ID or --yes. The run stays waiting until the
    consumer that owns it resumes it.
    """
    _decide("approve", run_id, approval_id, yes, by, note, db, as_json)


@cli.command()
@approval_options
def reject(run_id: str, approval_id: str | None, yes: bool, by: str | None, note: str,
           db: str | None, as_json: bool) -> None:
    """Refuse the request a run waits on, after printing it; the run is cancelled.

    Bound to the printed hash and confirmed as approve is.
    """
    _decide("reject", run_id, approval_id, yes, by, note, db, as_json)


@cli.command()
@click.argument("run_id", metavar="RUN")
@decision_options
@output_options
def cancel(run_id: str, by: str | None, note: str, db: str | None, as_json: bool) -> None:
    """End a run that has not finished, as operator_cancelled.

    A tool already running is not interrupted; its outcome is recorded late.
    """
    named_run(run_id)
    s = settings(db, as_json)
    who = operator_name(by)
    out = Out()
    with opened(s, write=True, echoed=(run_id,)) as store:
        view.cancel(store, run_id, who, note, observer=_stderr_trace())
        summary = view.summary_capped(store, run_id)

    def write() -> None:
        if s.as_json:
            write_document(out, {"run": summary.to_json()})
        else:
            _report_run(out, summary)

    _write_result(out, f"run {view.echo(run_id)} was cancelled", write)


# -- verify ----------------------------------------------------------------------


class HeadType(click.ParamType):  # type: ignore[type-arg]  # generic only from click 8.2
    """``SEQ:HASH``: an event's seq and the 64-hex-digit hash a check printed for it."""

    name = "SEQ:HASH"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int, str]:
        if isinstance(value, tuple):
            return value
        text = str(value)
        seq_text, sep, digest = text.partition(":")
        digest = digest.lower()
        digits = seq_text.lstrip("0")
        if (not sep or not seq_text.isdigit() or not seq_text.isascii() or not digits
                or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest)):
            self.fail(f"{view.echo(text)!r} is not SEQ:HASH, a seq of 1 or more and the 64 "
                      "hex digits of its hash, as verify prints them on its 'last checked' "
                      "line", param, ctx)
        # The length first: Python refuses int() of thousands of digits.
        if len(digits) > len(str(MAX_INT)) or int(digits) > MAX_INT:
            self.fail(f"seq {view.echo(digits)} is over {MAX_INT}, the largest seq an event "
                      "can have", param, ctx)
        return int(digits), digest


@cli.command()
@click.option("--from", "from_seq", type=Count(min=0, max=MAX_INT), default=0,
              metavar="N", help="First seq to check (default: 1).")
@click.option("--to", "to_seq", type=Count(min=0, max=MAX_INT), default=0,
              metavar="N", help="Last seq to check (default: the newest event).")
@click.option("--head", "kept", type=HeadType(), default=None,
              help="A head kept from an earlier check; it must still be there with "
                   "this hash, which catches events cut from the end.")
@output_options
def verify(from_seq: int, to_seq: int, kept: tuple[int, str] | None, db: str | None,
           as_json: bool) -> None:
    """Re-check the event hash chain. Exits 1 on a break.

    A chain cut at the end still verifies, since nothing after the cut is
    left to disagree; keep the 'last checked' seq and hash and pass them as
    --head next time to catch that.
    """
    if to_seq and to_seq < from_seq:
        raise click.UsageError(f"--to {to_seq} is before --from {from_seq}")
    if kept is not None and to_seq and kept[0] > to_seq:
        raise click.UsageError(f"--head seq {kept[0]} is after --to {to_seq}")
    if kept is not None and kept[0] < from_seq:
        raise click.UsageError(f"--head seq {kept[0]} is before --from {from_seq}")
    s = settings(db, as_json)
    out = Out()
    with opened(s) as store:
        check = view.check_chain(store, from_seq, to_seq, kept)
    problems = check.problems
    try:
        if s.as_json:
            write_document(out, _verify_json(check))
        else:
            for line in _verify_lines(check):
                out.line(line)
        out.flush()
    except OSError:
        # The exit code is the verdict: output that could not be written (a reader
        # that went away, a full disk) must not turn a broken chain into 0, nor
        # leave the interpreter's last flush to fail with its own 120.
        if not problems:
            raise
        if sys.stdout is not None:
            silence_stdout()
    if problems:
        raise click.ClickException(sanitize("; ".join(problems)))


def _verify_json(check: view.ChainCheck) -> dict[str, Any]:
    r = check.report
    doc: dict[str, Any] = {
        "head": {"seq": check.head_seq, "hash": check.head_hash},
        "from": r.from_seq,
        "to": r.to_seq,
        "hash": r.hash,
        "checked": r.checked,
        "intact": r.broken is None,
    }
    if r.broken is not None:
        doc["break"] = {"seq": r.broken.seq, "expected": r.broken.expected,
                        "found": r.broken.found, "detail": r.broken.detail}
    if check.requested_to:
        doc["requested"] = {"to": check.requested_to, "reached": check.reached}
    if check.kept is not None:
        k = check.kept
        doc["kept_head"] = {"seq": k.seq, "hash": k.hash, "found": k.found,
                            "matches": k.matches}
    return doc


def _verify_lines(check: view.ChainCheck) -> list[str]:
    r = check.report
    lines = [f"head: seq {check.head_seq} {sanitize(check.head_hash)}" if check.head_seq
             else "head: no events"]
    if r.broken is not None:
        b = r.broken
        lines += [f"broken at seq {b.seq}: {sanitize(b.detail)}",
                  f"  expected {sanitize(b.expected) or '-'}",
                  f"  found    {sanitize(b.found) or '-'}"]
    elif r.checked == 0:
        lines.append("intact: no events in the range")
    else:
        first = check.last_seq - r.checked + 1
        lines += [f"intact: {r.checked} event(s), seq {first} to {check.last_seq}",
                  f"last checked: seq {check.last_seq} {sanitize(r.hash)}"]
    if check.kept is not None and check.kept.matches:
        lines.append(f"kept head: seq {check.kept.seq} matches")
    return lines


@cli.command("help")
@click.argument("command", required=False)
@click.pass_context
def help_command(ctx: click.Context, command: str | None) -> None:
    """Show this help, or a command's."""
    parent = ctx.parent
    assert parent is not None
    if not command:
        click.echo(parent.get_help())
        return
    if command in ("resume", "recheck"):
        raise click.UsageError(_NO_RESUME if command == "resume" else _NO_RECHECK, ctx)
    found = cli.get_command(parent, command)
    if found is None:
        raise click.UsageError(f"no such command {command!r}", ctx)
    with click.Context(found, info_name=command, parent=parent) as sub:
        click.echo(found.get_help(sub))


def main(argv: list[str] | None = None) -> None:
    """Console entry point: exit 0 ok, 1 on failure (``error: <sentence>``), 2 on usage."""
    sys.exit(run_click(cli, "agentrt", argv))


if __name__ == "__main__":
    main()
