"""The JSON Lines sink: the live trace's bytes, written for the follower."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agentrt.events import Event
from agentrt.trace import jsonl, jsonl_record
from agentrt_export import JSONLSink

ROOT = Path(__file__).resolve().parent.parent
AT = datetime(2026, 9, 25, 14, 3, 4, 500000, tzinfo=UTC)

EVENTS = [
    Event(1, "run-1", "", AT, "run.created", b'{"goal":"a"}'),
    Event(2, "run-1", "step-1", AT, "step.decided", b'{"a":"<b>&"}'),
    Event(3, "run-1", "step-1", AT, "step.tool_finished", b'{ "out" : "x\\ny" }'),
    Event(4, "run-1", "", AT, "run.finished", b""),
    Event(5, "run-1", "", AT, "future.event", b"not json"),
]


class BrokenStream(io.RawIOBase):
    """Writes fail, as on a full disk."""

    def __init__(self) -> None:
        self.calls = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self.calls += 1
        raise OSError(28, "No space left on device")


def test_jsonl_sink_writes_the_bytes_of_the_live_trace():
    live, exported = io.BytesIO(), io.BytesIO()
    observe = jsonl(live)
    sink = JSONLSink(exported)
    for e in EVENTS:
        observe(e)
        sink(e)
    sink.flush()
    assert exported.getvalue() == live.getvalue()
    assert exported.getvalue() == b"".join(jsonl_record(e) for e in EVENTS)


def test_jsonl_sink_writes_to_a_text_stream():
    out = io.StringIO()
    sink = JSONLSink(out)
    for e in EVENTS:
        sink(e)
    sink.flush()
    assert out.getvalue().encode() == b"".join(jsonl_record(e) for e in EVENTS)


def test_jsonl_sink_raises_a_write_failure_and_keeps_raising_it():
    out = BrokenStream()
    sink = JSONLSink(out)
    with pytest.raises(OSError) as first:
        sink(EVENTS[0])
    with pytest.raises(OSError) as second:
        sink(EVENTS[1])
    assert second.value is first.value
    assert sink.err() is first.value
    with pytest.raises(OSError):
        sink.flush()
    assert out.calls == 1


def test_jsonl_sink_flush_reports_a_reader_that_went_away(tmp_path):
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    with open(write_fd, "wb") as stream:  # buffered: the write itself succeeds
        sink = JSONLSink(stream)
        sink(EVENTS[0])
        with pytest.raises(BrokenPipeError):
            sink.flush()
        with pytest.raises(BrokenPipeError):
            sink(EVENTS[1])
        stream.raw.close()  # nothing left to flush into a closed pipe


def test_jsonl_sink_leaves_records_buffered_until_flush(tmp_path):
    path = tmp_path / "out.jsonl"
    with open(path, "wb") as stream:
        sink = JSONLSink(stream)
        sink(EVENTS[0])
        assert path.read_bytes() == b""
        sink.flush()
        assert path.read_bytes() == jsonl_record(EVENTS[0])


@pytest.mark.parametrize("binary", [True, False])
def test_jsonl_sink_writes_a_page_at_once_and_flushes_it(tmp_path, binary):
    path = tmp_path / "out.jsonl"
    with open(path, "wb" if binary else "w", encoding=None if binary else "utf-8") as stream:
        sink = JSONLSink(stream)
        sink.handle_page(EVENTS)
        assert path.read_bytes() == b"".join(jsonl_record(e) for e in EVENTS)


def test_jsonl_sink_raises_a_page_write_failure_and_keeps_raising_it():
    out = BrokenStream()
    sink = JSONLSink(out)
    with pytest.raises(OSError) as first:
        sink.handle_page(EVENTS)
    with pytest.raises(OSError) as second:
        sink.handle_page(EVENTS)
    assert second.value is first.value
    assert out.calls == 1


def test_jsonl_sink_writes_to_stdout_buffer_in_a_real_process():
    code = (
        "import sys\n"
        "from datetime import UTC, datetime\n"
        "from agentrt.events import Event\n"
        "from agentrt_export import JSONLSink\n"
        "sink = JSONLSink(sys.stdout.buffer)\n"
        "at = datetime(2026, 9, 25, 14, 3, 4, 500000, tzinfo=UTC)\n"
        "sink(Event(2, 'run-1', 'step-1', at, 'step.decided', b'{\"a\":\"<b>&\\xc3\\xa9\"}'))\n"
        "sink.flush()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="ascii")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, check=True, timeout=60
    )
    expected = jsonl_record(
        Event(2, "run-1", "step-1", AT, "step.decided", '{"a":"<b>&é"}'.encode())
    )
    assert done.stdout == expected


class WouldBlock(io.RawIOBase):
    """A non-blocking raw stream with no room: write() returns None."""

    def writable(self) -> bool:
        return True

    def write(self, data) -> None:  # type: ignore[override]
        return None


def test_a_raw_stream_that_would_block_is_a_failure_not_a_delivery(tmp_path):
    from agentrt.store import open_store
    from agentrt_export import Follower, MemoryCursor

    store = open_store(str(tmp_path / "e.db"))
    with store.tx() as tx:
        tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                   "VALUES ('r', 'g', 'RUNNING', '{}', '2026-10-01T09:00:00Z')")
        for i in range(3):
            tx.append("r", "", datetime(2026, 10, 1, 9, 0, i, tzinfo=UTC), "x.y", b"{}")
    cursor = MemoryCursor()
    with pytest.raises(BlockingIOError):
        Follower(store, cursor=cursor, once=True).follow(JSONLSink(WouldBlock()))
    assert cursor.load() == 0  # nothing was written, so nothing counts as delivered


@pytest.mark.parametrize("per_event", [False, True])
def test_jsonl_sink_completes_a_record_an_earlier_write_cut_short(tmp_path, per_event):
    whole = b"".join(jsonl_record(e) for e in EVENTS)
    path = tmp_path / "out.jsonl"
    path.write_bytes(whole[:10])  # the first record, torn
    notes: list[str] = []
    with open(path, "ab") as out:
        sink = JSONLSink(out, on_mend=notes.append)
        if per_event:
            for e in EVENTS:
                sink(e)
            sink.flush()
        else:
            sink.handle_page(EVENTS)
    assert path.read_bytes() == whole
    assert notes == ["the output ended in the first 10 bytes of the next record, cut short "
                     "by an earlier write; wrote the rest of it"]


def test_jsonl_sink_mends_only_a_regular_file_it_writes_at_the_end_of(tmp_path):
    record = jsonl_record(EVENTS[0])
    path = tmp_path / "out.jsonl"
    path.write_bytes(record[:10] + b"0123456789")
    with open(path, "r+b") as out:  # writing over the start: nothing is appended
        JSONLSink(out).handle_page(EVENTS[:1])
    assert path.read_bytes() == record
    text = io.StringIO()
    text.write('{"torn"')
    JSONLSink(text).handle_page(EVENTS[:1])  # a text stream is written as it is
    assert text.getvalue() == '{"torn"' + record.decode()


_PAGE_OVER_A_FULL_DISK = """
import resource, sys
from agentrt.events import Event
from agentrt_export import JSONLSink
from agentrt_export.follower import PartialPage
resource.setrlimit(resource.RLIMIT_FSIZE, (450, 450))  # a disk full after 450 bytes
events = [Event(i, "run-1", "step-1", "2026-10-01T09:00:00Z", "step.decided",
                b'{"i":%d,"text":"abcdefghijklmnopqrstuvwxyz"}' % i) for i in range(1, 11)]
page = {"list": events, "generator": (e for e in events), "map": map(lambda e: e, events)}
try:
    JSONLSink(open(sys.argv[1], "ab")).handle_page(page[sys.argv[2]])
except PartialPage as exc:
    print(exc.accepted)
"""


@pytest.mark.parametrize("kind", ["list", "generator", "map"])
def test_a_page_given_as_any_iterable_counts_the_whole_records_a_full_disk_took(
        tmp_path: Path, kind: str) -> None:
    """A wrapping sink may pass a page on lazily (map(redact, events)); the
    records that reached the file still move the cursor past them."""
    out = tmp_path / "out.jsonl"
    done = subprocess.run([sys.executable, "-c", _PAGE_OVER_A_FULL_DISK, str(out), kind],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3"]
    assert out.read_bytes().count(b"\n") == 3
