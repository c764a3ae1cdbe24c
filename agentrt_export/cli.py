"""``agentrt-export``: ship a database's events to log tooling or a collector.

Records go to stdout, diagnostics to stderr. SIGTERM, SIGINT and SIGHUP
finish the page in hand, save the cursor and exit 0; a closed pipe (``| head``)
ends quietly without saving past what was written. Exit codes: 0 ok,
1 failure, 2 usage.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import stat
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import apsw
import click

from agentrt.clitools import Count, run_click, schema_sentence
from agentrt.errors import AgentrtError, SchemaVersionError
from agentrt.store import Store, open_existing
from agentrt.trace import sanitize
from agentrt_export.cursor import Cursor, FileCursor, MemoryCursor
from agentrt_export.follower import (
    DEFAULT_PAGE_SIZE,
    MAX_INTERVAL,
    MAX_PAGE_SIZE,
    Follower,
    Sink,
    file_identity,
)
from agentrt_export.signals import stop_on_signals
from agentrt_export.sinks import JSONLSink, OutputStopped

__all__ = ["FollowSettings", "follower_options", "main", "run_follower"]

F = TypeVar("F", bound=Callable[..., Any])

#: Below this many events behind, no progress line is worth drawing.
_PROGRESS_BACKLOG = 10_000
#: The shortest ``--interval``: the follower's own quickest re-check. Shorter
#: waits (0 among them) only spin a core; nan and inf are no wait at all.
_MIN_INTERVAL = 0.001


class _Seconds(click.ParamType):  # type: ignore[type-arg]  # generic only from click 8.2
    """``--interval``: a finite wait of at least 1 ms; above the cap waits the cap."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds >= _MIN_INTERVAL):
            self.fail(
                f"{sanitize(str(value))} is not a wait this follower can keep: give a number "
                f"of seconds from {_MIN_INTERVAL:g} up (a wait over {MAX_INTERVAL:g} s is cut "
                f"to {MAX_INTERVAL:g} s)",
                param, ctx)
        return seconds


@dataclass(frozen=True)
class FollowSettings:
    """The follower options every ``agentrt-export`` subcommand shares."""

    db: str
    cursor_file: str | None
    run: str | None
    after_seq: int | None
    follow: bool
    interval: float | None
    page_size: int


def follower_options(fn: F) -> F:
    """Declare the shared follower options once (used by ``jsonl`` and ``otel``)."""
    options = [
        click.option("--db", envvar="AGENTRT_DB", metavar="PATH",
                     help="The database to read (default: $AGENTRT_DB). Opened read-only."),
        click.option("--cursor-file", metavar="FILE",
                     help="Where the position is kept across runs (created 0600). One "
                          "saved with --run ID serves only that run's export."),
        click.option("--run", "run", metavar="ID", help="Only this run's events."),
        click.option("--after-seq", type=Count(min=0), metavar="N",
                     help="Start after this seq instead of a cursor file."),
        click.option("--follow", "-f", is_flag=True,
                     help="Keep following new commits until SIGTERM, SIGINT or SIGHUP."),
        click.option("--interval", type=_Seconds(), metavar="SECONDS",
                     help="Longest wait between checks once caught up "
                          "(default: 1 s with change notification, else 5 ms)."),
        click.option("--page-size", type=Count(min=1, max=MAX_PAGE_SIZE),
                     default=DEFAULT_PAGE_SIZE, show_default=True,
                     help="Events per read; at most one page is delivered again after "
                          "a hard kill."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def settings_from(**kw: Any) -> FollowSettings:
    if not kw.get("db"):
        raise click.UsageError("no database: pass --db or set AGENTRT_DB")
    if kw.get("run") == "":
        raise click.UsageError("--run is empty: give a run id, or leave --run out to export "
                               "every run")
    if kw.get("cursor_file") == "":
        raise click.UsageError("--cursor-file is empty: name the file that keeps the position, "
                               "or leave --cursor-file out")
    if kw.get("cursor_file") is not None and kw.get("after_seq") is not None:
        raise click.UsageError("pass --cursor-file or --after-seq, not both")
    return FollowSettings(kw["db"], kw.get("cursor_file"), kw.get("run"), kw.get("after_seq"),
                          bool(kw.get("follow")), kw.get("interval"), kw["page_size"])


#: Set by SIGTERM, SIGINT and SIGHUP once ``main`` installed its handlers: from then
#: to the process's exit a signal means "stop cleanly", never "die", so one
#: that lands after the last page was saved still exits 0.
_STOP = threading.Event()


class _Progress:
    """The progress line while a backlog drains at a terminal, drawn once a page.

    It ends (a newline) when the follower caught up, which a short page says
    too (a ``--run`` whose last event is below the head), and at the latest
    when the follower returns, so the sentence of a failure starts a line of
    its own; pages a live follow delivers later draw nothing.
    """

    def __init__(self, store: Store, page_size: int) -> None:
        self._head, _ = store.chain_head()
        self._page_size = page_size
        self._shown = False
        self._ended = False

    def __call__(self, seq: int, count: int) -> None:
        if self._ended or (self._head - seq < _PROGRESS_BACKLOG and not self._shown):
            return
        self._shown = True
        self._draw(f"\rexported through seq {seq} of {self._head}")
        if seq >= self._head or count < self._page_size:
            self.end()

    def end(self) -> None:
        if self._shown and not self._ended:
            self._draw("\n")
        self._ended = True

    def _draw(self, text: str) -> None:
        # The terminal may be gone (a hangup: EIO); the progress line is not the
        # export, so it stops being drawn instead of failing the command.
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            self._ended = True


def run_follower(
    settings: FollowSettings,
    make_sink: Callable[[Store, threading.Event], Sink],
    clean_stop: type[Exception] | None = None,
    *,
    records_on_stdout: bool = False,
) -> None:
    """Open read-only, follow into the sink, and turn expected failures into exit codes.

    ``make_sink`` gets the store and the stop event SIGTERM, SIGINT and SIGHUP set. An
    exception of type ``clean_stop`` ends the command with exit 0 and one line
    on stderr (a stop that came before the page in hand was delivered). With
    ``records_on_stdout``, a follow ends quietly once the pipe's reader went
    away, as a write to it would. Every sentence is sanitized: it carries
    paths and ids as given. A cursor file is held (see ``FileCursor.acquire``)
    before the database is opened, until the command ends.
    """
    cursor: Cursor | None = None
    if settings.cursor_file is not None:
        try:
            cursor = FileCursor(settings.cursor_file)
            cursor.check(database=settings.db)  # before a lock file is made beside it
            cursor.acquire()
        except AgentrtError as exc:
            raise _failure(str(exc)) from None
    elif settings.after_seq is not None:
        cursor = MemoryCursor(settings.after_seq)
    try:
        _follow(settings, cursor, make_sink, clean_stop, records_on_stdout)
    finally:
        if isinstance(cursor, FileCursor):
            cursor.close()


def _follow(
    settings: FollowSettings,
    cursor: Cursor | None,
    make_sink: Callable[[Store, threading.Event], Sink],
    clean_stop: type[Exception] | None,
    records_on_stdout: bool,
) -> None:
    """``run_follower`` once the cursor is held."""
    try:
        store = open_existing(settings.db, read_only=True)
    except SchemaVersionError as exc:
        # The operator command's sentence, so both commands say the same.
        raise _failure(schema_sentence(settings.db, exc)) from None
    except AgentrtError as exc:
        raise _failure(str(exc)) from None
    opened = file_identity(settings.db)
    with store:
        progress: _Progress | None = None
        try:
            if settings.after_seq is not None:
                _check_after_seq(store, settings.after_seq)
            if sys.stderr is not None and sys.stderr.isatty():
                progress = _Progress(store, settings.page_size)
            follower = Follower(
                store,
                run_id=settings.run,
                cursor=cursor,
                interval=settings.interval,
                page_size=settings.page_size,
                once=not settings.follow,
                on_page=progress,
            )
            if settings.follow and records_on_stdout:
                _stop_when_the_reader_leaves(_STOP)
            try:
                follower.follow(make_sink(store, _STOP), _STOP)
            finally:
                if progress is not None:
                    progress.end()
            if _READER_GONE.is_set():
                _silence_stdout()
                return
            if settings.run and not settings.follow and not store.list_events_after(
                    settings.run, 0, 1):
                # Not a failure: a run may simply have no events (yet), but an
                # empty stdout alone does not tell a typo from that.
                from agentrt.view.errors import echo  # only when it says so

                click.echo(sanitize(f"no events of run {echo(settings.run)} in {settings.db}"),
                           err=True)
        except BrokenPipeError:
            # The reader went away (``| head``): end quietly; the cursor was
            # not saved past what reached the pipe.
            _silence_stdout()
        except AgentrtError as exc:
            notes = getattr(exc, "__notes__", None)
            if clean_stop is not None and isinstance(exc, clean_stop) and notes:
                # The cursor of what was delivered could not be saved: the next
                # start delivers it again, which is not a clean stop.
                raise _failure(f"{exc}; " + "; ".join(notes)) from None
            if clean_stop is not None and isinstance(exc, clean_stop):
                # A full output gave up the page after its whole records, which
                # the cursor passed; any other stop gave up the whole page.
                rest = (_resumes(cursor, settings.run) if isinstance(exc, OutputStopped)
                        else getattr(exc, "resent", "the page is sent again on restart"))
                click.echo(sanitize(f"stopped: {exc}; {rest}"), err=True)
                return
            raise _failure(str(exc)) from None
        except apsw.Error as exc:
            raise _failure(f"reading {settings.db}: {exc}{_swapped(settings.db, opened)}"
                           ) from None
        except OSError as exc:
            raise _failure(f"writing events to standard output: {exc.strerror or exc}; "
                           f"{_resumes(cursor, settings.run)}") from None


#: Set when standard output is a pipe whose reader went away while following.
_READER_GONE = threading.Event()


def _stop_when_the_reader_leaves(stop: threading.Event) -> None:
    """Stop a follow once nobody reads the pipe on standard output (``| head -n 3``).

    Without new commits nothing is written, so no write fails to say so, and
    the pipeline would wait for the next commit, forever on an idle database.
    A pipe whose reader closed reports an error to poll(2) at once.
    """
    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode) or not hasattr(select, "poll"):
            return
    except (AttributeError, OSError, ValueError):
        return

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, 0)  # poll reports POLLERR (no reader left) and POLLHUP unasked
        for _, mask in poller.poll():
            if mask & (select.POLLERR | select.POLLHUP):
                _READER_GONE.set()
                stop.set()

    threading.Thread(target=watch, name="agentrt-export stdout reader", daemon=True).start()


def _swapped(path: str, opened: tuple[int, int] | None) -> str:
    """What a read error may really mean: the file was replaced or emptied while
    it was followed (a restore, a copy over it), which SQLite reports as a
    malformed or empty database although the new file may be sound."""
    now = file_identity(path)
    if opened is None or now is None:
        return ""
    if now != opened:
        return ("; the file was replaced while it was followed: start again to follow the "
                "new one, after checking that the cursor belongs to it")
    if os.path.getsize(path) == 0:
        return "; the file was emptied while it was followed"
    return ""


def _resumes(cursor: Cursor | None, run: str | None = None) -> str:
    """Where the next start resumes, after output failed part way."""
    if not isinstance(cursor, FileCursor):
        return "no cursor file was given, so nothing was saved"
    try:
        seq = cursor.load()
    except Exception:  # the sentence is about the output; the cursor speaks for itself later
        return f"the cursor is in {cursor.path}"
    if not seq and not os.path.exists(cursor.path):
        if run is None:
            events = "every event"
        else:
            from agentrt.view.errors import echo  # only when it says so

            events = f"every event of run {echo(run)}"
        return (f"no position was saved yet in {cursor.path}, so the next start writes "
                f"{events} again")
    return (f"{cursor.path} holds seq {seq}: the next start writes the events after it, "
            "completing a record cut short in a file it appends to")


def _failure(sentence: str) -> click.ClickException:
    """Exit 1 with one line: paths, ids and SQLite's text are shown escaped."""
    return click.ClickException(sanitize(sentence))


def _check_after_seq(store: Store, after_seq: int) -> None:
    """Refuse ``--after-seq`` past the head in the flag's own terms (no cursor file
    is involved). Exit 1, not 2: the number is well formed, the database does not
    reach it, as ``agentrt show`` of a run the database lacks."""
    if after_seq == 0:
        return
    head, _ = store.chain_head()
    if after_seq <= head:
        return
    if head:
        raise _failure(f"--after-seq {after_seq} is past the last event of {store.path} "
                       f"(seq {head}); give a seq up to {head}, or leave --after-seq out to "
                       "start at the first event")
    raise _failure(f"--after-seq {after_seq} is past the end of {store.path}, which holds no "
                   "events yet; leave --after-seq out to start at the first event")


def _silence_stdout() -> None:
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Ship agentrt events, read-only, to log tooling or an OpenTelemetry collector."""


@cli.command()
@follower_options
def jsonl(**kw: Any) -> None:
    """Write events as JSON Lines on stdout, one object per event.

    Each record holds seq, run_id, step_id (left out when empty), at, type and
    payload. seq is unique in a database, so a downstream store can
    deduplicate on it.
    """
    settings = settings_from(**kw)
    run_follower(settings,
                 lambda store, stop: JSONLSink(sys.stdout.buffer, on_mend=_note, stop=stop),
                 clean_stop=OutputStopped, records_on_stdout=True)


def _note(sentence: str) -> None:
    click.echo(f"agentrt-export: {sentence}", err=True)


def _parse_headers(values: tuple[str, ...]) -> dict[str, str] | None:
    headers: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key.strip():
            # Never the value: a header may carry a secret ("Authorization: Bearer ...").
            # Only a name written as HTTP writes one ("Name: value") is shown.
            name = value.split(":", 1)[0].strip() if ":" in value else ""
            if len(name) > 40 or any(c.isspace() or c == "=" for c in name):
                name = ""
            shown = f" ({sanitize(name)}...)" if name else ""
            raise click.UsageError(f"otel: --header{shown} is not KEY=VALUE: write it as "
                                   "KEY=VALUE, e.g. --header authorization=...")
        headers[key.strip()] = val.strip()
    return headers or None


@cli.command()
@follower_options
@click.option("--endpoint", metavar="URL",
              help="Collector address (default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "
                   "OTEL_EXPORTER_OTLP_ENDPOINT, then localhost).")
@click.option("--protocol", type=click.Choice(["grpc", "http/protobuf"], case_sensitive=False),
              help="OTLP transport (default: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "
                   "OTEL_EXPORTER_OTLP_PROTOCOL, then http/protobuf).")
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE",
              help="A header sent with every export (repeatable); beats "
                   "OTEL_EXPORTER_OTLP_HEADERS.")
@click.option("--insecure", is_flag=True, default=None,
              help="Plain-text gRPC (no TLS).")
def otel(endpoint: str | None, protocol: str | None, headers: tuple[str, ...],
         insecure: bool | None, **kw: Any) -> None:
    """Send each run as one OpenTelemetry trace to a collector over OTLP.

    Spans are built directly and exported a page at a time; the cursor moves
    only after the collector accepted the page, and a failed export is retried
    with backoff, never skipped. Configuration follows the OTEL_* environment
    variables; flags override them.
    """
    from agentrt_otel import ConfigError, ExportStopped, OTelSink, build_exporter, resolve_config
    from agentrt_otel.complaints import ExporterComplaints
    from agentrt_otel.config import redacted

    settings = settings_from(**kw)
    try:
        config = resolve_config(protocol=protocol, endpoint=endpoint,
                                headers=_parse_headers(headers), insecure=insecure)
        exporter = build_exporter(config)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    for warning in config.warnings:  # a setting ignored, as the specification says
        click.echo(warning, err=True)
    # The SDK logs every failed attempt in several lines; one line per outage,
    # naming the collector and the cause, is written by the sink instead.
    complaints = ExporterComplaints(redacted(config.endpoint)).install()

    sinks: list[OTelSink] = []

    def make_sink(store: Store, stop: threading.Event) -> Sink:
        sink = OTelSink(exporter, source=store, resource=config.resource(), stop=stop,
                        complaints=complaints)
        sinks.append(sink)
        return sink

    try:
        run_follower(settings, make_sink, clean_stop=ExportStopped,
                     records_on_stdout=config.exporter == "console")
    finally:
        for sink in sinks:
            sink.close()
        complaints.uninstall()


def _stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM, SIGINT and SIGHUP (the terminal closed) stop cleanly; a SIGINT
    or SIGHUP ignored on the way in stays ignored: ``nohup`` ignores SIGHUP, and
    a shell script's ``cmd &`` SIGINT, so that a Ctrl-C for the foreground
    leaves the job alone. SIGTERM is taken even when ignored on the way in (a
    wrapper's ``trap '' TERM``): it is how a supervisor stops the command, and
    left ignored, only its SIGKILL would, with the page in hand sent again."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # stop_on_signals skips an ignored one
    wanted = (signal.SIGINT, getattr(signal, "SIGHUP", None))
    return (signal.SIGTERM, *(s for s in wanted
                              if s is not None and signal.getsignal(s) != signal.SIG_IGN))


def main(argv: list[str] | None = None, *, stopped: list[int] | None = None) -> None:
    """Console entry point: exit 0 ok, 1 on failure (``error: <sentence>``), 2 on usage.

    ``stopped`` (from :mod:`agentrt_export.entry`) holds the stop signals that
    came before this module was loaded, and keeps getting those that come
    until its own handlers are in: any of them and the command starts stopped.
    """
    stopping = _stop_signals()
    stop_on_signals(_STOP, stopping)
    if stopped:
        _STOP.set()
    code = run_click(cli, "agentrt-export", argv)
    # Interpreter shutdown puts Python-level handlers back to the default
    # (terminate), but leaves an ignored signal ignored: the work is done and
    # saved, so a late signal must not turn a clean exit into -15.
    for s in stopping:
        signal.signal(s, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    main()
