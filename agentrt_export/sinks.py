"""Sinks: where a follower hands each event. A sink raises to refuse one.

The follower treats any ``Exception`` from a sink as a refusal: it stops with
the cursor before that event, so the next start hands it over again.
"""

from __future__ import annotations

import bz2
import errno
import fcntl
import gzip
import io
import lzma
import os
import socket
import stat
import threading
import zipfile
from collections.abc import Callable, Sequence
from typing import IO

from agentrt.errors import described
from agentrt.events import Event
from agentrt.trace import (
    LineWriter,
    OutputStopped,
    check_stream,
    jsonl_page,
    jsonl_record,
    plain_descriptor,
)
from agentrt_export.follower import FollowError, PartialPage

__all__ = ["JSONLSink", "OutputStopped"]


def _layers(stream: object) -> list[object]:
    """``stream`` and the file objects under it, outermost first: a text stream's
    buffer, a buffer's raw file, a gzip file's file."""
    layers: list[object] = []
    layer: object = stream
    while layer is not None and all(layer is not seen for seen in layers) and len(layers) < 16:
        layers.append(layer)
        layer = next((getattr(layer, name) for name in ("buffer", "raw", "fileobj", "_buffer")
                      if getattr(layer, name, None) is not None), None)
    return layers


_HOLDING = (bz2.BZ2File, lzma.LZMAFile, getattr(zipfile, "_ZipWriteFile", bz2.BZ2File))


def _refuse_holding_compressor(stream: object) -> None:
    """Refuse a compressor the cursor could pass: a bz2, lzma or zip member's
    ``flush`` writes nothing (what it was given stays in the compressor until it
    is closed), and a gzip file writing straight to an unbuffered or
    non-blocking descriptor drops what a short write leaves (the follower would
    save its cursor past events the file does not hold; a kill would lose
    them). gzip over a buffered, blocking file is taken: its flush writes what
    it holds, and a failed write raises."""
    for layer in _layers(stream):
        if isinstance(layer, _HOLDING):
            kind = ("bz2" if isinstance(layer, bz2.BZ2File) else
                    "lzma" if isinstance(layer, lzma.LZMAFile) else "zip member")
            raise FollowError(
                f"JSONLSink: a {kind} file keeps what it is given until it is closed, so "
                "the cursor would pass events it has not written: use gzip.open (its flush "
                "writes what it holds), or compress the plain output (agentrt-export jsonl "
                "| xz)")
        if isinstance(layer, gzip.GzipFile) and _drops_short_writes(layer.fileobj):
            raise FollowError(
                "JSONLSink: this gzip file writes to an unbuffered or non-blocking file, "
                "where gzip drops what a short write leaves, so the cursor would pass "
                "events it has not written: give gzip a buffered, blocking file "
                "(open(path, 'wb')), or pipe the plain output into gzip")


def _drops_short_writes(under: object) -> bool:
    if isinstance(under, (io.FileIO, socket.SocketIO)):
        return True
    try:
        fd = under.fileno()  # type: ignore[attr-defined]
        return not os.get_blocking(fd)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


class JSONLSink:
    """Writes one JSON Lines record per event, the same bytes a live
    :func:`agentrt.trace.jsonl` observer writes for it (but for a payload over
    64 Ki characters, which a follower's capped read delivers as the
    truncation object, while a live trace writes it whole).

    Prefer a binary stream (``sys.stdout.buffer``): records go out exactly as
    built. A text stream works too, with its encoding and newline handling.

    A non-blocking output (a pipe a parent process made non-blocking) that is
    full is waited out, as a blocking one would be, so a slow reader gets
    every record whole and in order. Give the follower's ``stop`` event as
    ``stop``: once it is set and the output stays full for a moment, the page
    in hand is given up with :class:`~agentrt.trace.OutputStopped` after the
    record part written is finished (given a few seconds; a reader that takes
    nothing for that long gets a torn last line, which a restart writes again
    whole). The cursor moves past the records written.

    A follower hands it whole pages (:meth:`handle_page`): a page's records
    go out in one write and are flushed before the follower saves the cursor,
    so a write that fails (a closed pipe, a full disk) stops the follower
    before the cursor moves past the page. Called per event, records are
    buffered by the stream until :meth:`flush`. The first failure is kept:
    every later event, page and flush raises it again.

    Appending to a file that an earlier write left torn (it does not end in a
    newline), the first write completes the record cut short, or ends a line
    that is not that record with a newline; ``on_mend`` is told which, in one
    sentence.
    """

    def __init__(self, stream: IO[bytes] | IO[str], *,
                 on_mend: Callable[[str], None] | None = None,
                 stop: threading.Event | None = None) -> None:
        check_stream(stream, "JSONLSink", FollowError)
        _refuse_holding_compressor(stream)
        if stop is not None and not isinstance(stop, threading.Event):
            raise FollowError(f"JSONLSink: stop is {described(stop)}, not a threading.Event "
                              "or None: pass the event given to Follower.follow")
        self._stream = stream
        self._out = LineWriter(stream, flush_each=False, wait=True, stop=stop)
        self._write = self._out.write
        self._mended = False
        self._on_mend = on_mend
        #: The mend's sentence, told once the write that mends is done: said
        #: before it, on a stderr that shares the output file (systemd's
        #: StandardError=inherit, ``>> f 2>&1``), it would split the record.
        self._mend_note: str | None = None

    def __call__(self, event: Event) -> None:
        """Write ``event``'s record; raise the write failure, if any."""
        record = jsonl_record(event)
        if not self._mended:
            record, _ = self._mend(record)
        self._write(record)  # buffered: the mend is told once flush() pushed it

    def _mend(self, data: bytes) -> tuple[bytes, int]:
        """What to write instead of ``data`` so that the file it goes to holds
        whole lines, and how many bytes of ``data`` the file holds already.

        Checked once, before the first write. A file that does not end in a
        newline holds the start of a record a write cut short (a full disk, a
        file size limit): the cursor stayed before that record, so it comes
        first again, and only its rest is written. A tail that is not the
        start of ``data`` is ended with a newline, so it spoils no record.
        """
        self._mended = True
        tail = torn_tail(self._stream)
        if not tail:
            return data, 0
        if data.startswith(tail):
            self._mend_note = (f"the output ended in the first {len(tail)} bytes of the next "
                               "record, cut short by an earlier write; wrote the rest of it")
            return data[len(tail):], len(tail)
        self._mend_note = (f"the output ended in an unfinished line of {len(tail)} bytes that "
                           "is not the next record; ended it with a newline")
        return b"\n" + data, -1

    def _tell_mend(self) -> None:
        note, self._mend_note = self._mend_note, None
        if note is not None and self._on_mend is not None:
            self._on_mend(note)

    def handle_page(self, events: Sequence[Event]) -> None:
        """Write the records of a page at once and flush them; raise the failure, if any.

        The same bytes as calling the sink per event and then :meth:`flush`,
        with one write per page instead of one per record. When a write fails
        after whole records arrived (a disk that filled up mid-page), it
        raises :class:`~agentrt_export.follower.PartialPage` saying how many,
        so the cursor moves past them and a restart writes none of them twice.
        """
        if not isinstance(events, (list, tuple)):
            events = list(events)  # an iterator would be empty when counted after a failure
        data, held = jsonl_page(events), 0
        if not self._mended:
            data, held = self._mend(data)
        try:
            self._out.write_through(data)
        except Exception as exc:
            accepted, arrived = 0, self._out.arrived + held
            for event in events:  # the same records again, only to count them
                arrived -= len(jsonl_record(event))
                if arrived < 0:
                    break
                accepted += 1
            if self._out.arrived:
                self._tell_mend()  # the mend reached the file: say so, cut short or not
            if accepted:
                raise PartialPage(accepted, exc) from exc
            raise
        self._tell_mend()
        _sync_regular_file(self._stream)  # raises: no record of the page counts as delivered

    def flush(self) -> None:
        """Push written records to their destination; raise on failure."""
        self._out.flush()
        self._tell_mend()

    def err(self) -> Exception | None:
        """The first write or flush failure, or None."""
        return self._out.err()


def _sync_regular_file(stream: object) -> None:
    """fdatasync the regular file under ``stream``: the cursor is fsynced after
    the page, so after a power cut the file must hold at least what the cursor
    says was delivered. Pipes, terminals and streams without a descriptor are
    left alone."""
    try:
        fd = int(stream.fileno())  # type: ignore[attr-defined]
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return
    try:
        getattr(os, "fdatasync", os.fsync)(fd)  # macOS has no fdatasync
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # a file system that cannot sync: as durable as it makes it
            raise


#: How far back :func:`torn_tail` looks for the newline before a torn record.
_TAIL_LIMIT = 16 << 20


def torn_tail(stream: object) -> bytes:
    """The bytes after the last newline of the regular file ``stream`` writes
    at the end of, or b'' when it ends in a newline, is empty, is not a binary
    file object of Python's own over a regular file (a compressor's file holds
    other bytes than those written), or cannot be read back.

    Standard output opened with ``>>`` is write-only, so the file is read
    through a descriptor of its own (``/proc/self/fd`` on Linux).
    """
    try:
        if isinstance(stream, io.TextIOBase):
            return b""
        fd = plain_descriptor(stream)  # not a compressor's file: it holds other bytes
        if fd is None:
            return b""
        stream.flush()  # type: ignore[attr-defined]
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return b""
        if not (fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND) \
                and os.lseek(fd, 0, os.SEEK_CUR) != st.st_size:
            return b""  # writing over the middle of a file: not a tail to mend
        reader = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    except (OSError, ValueError):
        return b""
    try:
        end = os.fstat(reader).st_size
        tail = b""
        while len(tail) < _TAIL_LIMIT and len(tail) < end:
            start = max(0, end - len(tail) - 65536)
            chunk = os.pread(reader, end - len(tail) - start, start)
            if not chunk:
                return b""
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                return chunk[cut + 1:] + tail
            tail = chunk + tail
        return tail if len(tail) == end else b""  # no newline within reach: leave it
    except OSError:
        return b""
    finally:
        os.close(reader)
