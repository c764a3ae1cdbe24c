"""The page read's rows become its events in C (agentrt/_eventrows.c): a row
only its reader holds takes the event class as its type, any other is copied,
a row not in the runtime's own types sends the page to the converting query,
and the store reads the same events with the module as without it."""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import apsw
import pytest
from _asan_kit import run_under_asan
from _fixtures_kit import copy_fixture
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import insert_run

from agentrt import open_store
from agentrt.events import Event, event_from_fields
from agentrt.store import pages

try:
    from agentrt._eventrows import events_of
except ImportError:  # no C compiler at install (test_packaging.py fails if there is one)
    events_of = None  # type: ignore[assignment]

pytestmark = pytest.mark.skipif(events_of is None, reason="agentrt._eventrows not built")

EVENT_CLASS: Any = event_from_fields  # the class the store builds its events of


class FreshRows:
    """Rows built on the fly, as apsw's are: nobody holds one but its reader.
    ``seen`` gets each row's id, not the row."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen: list[int] = []

    def __iter__(self) -> FreshRows:
        return self

    def __next__(self) -> tuple[Any, ...]:
        i = len(self.seen)
        if i == self.n:
            raise StopIteration
        row = (i + 1, f"run-{i}", "", "2026-12-01T09:00:00Z", "step.started",
               b'{"i":%d}' % i)
        self.seen.append(id(row))
        return row


def test_a_row_only_its_reader_holds_becomes_the_event_itself() -> None:
    rows = FreshRows(3)
    events = events_of(rows, EVENT_CLASS)
    assert events is not None
    assert [id(e) for e in events] == rows.seen
    assert all(type(e) is EVENT_CLASS and isinstance(e, Event) for e in events)
    assert [(e.seq, e.run_id, e.payload) for e in events] == [
        (1, "run-0", b'{"i":0}'), (2, "run-1", b'{"i":1}'), (3, "run-2", b'{"i":2}')]


def test_a_row_someone_else_holds_is_copied_and_keeps_its_type() -> None:
    rows = [(1, "r", "s", "2026-12-01T09:00:00Z", "step.started", b"{}")]
    events = events_of(rows, EVENT_CLASS)
    assert events is not None
    assert type(rows[0]) is tuple
    assert type(events[0]) is EVENT_CLASS
    assert tuple(events[0]) == rows[0] and events[0] is not rows[0]


@pytest.mark.parametrize("row", [
    (1, None, "", "t", "step.started", b"{}"),  # NULL text
    (1, 7, "", "t", "step.started", b"{}"),  # a number where text is
    (1, "r", b"s", "t", "step.started", b"{}"),  # a blob where text is
    (1, "r", "", "t", "step.started", None),  # NULL payload
    (1, "r", "", "t", "step.started", "{}"),  # a payload read as text
    (1.0, "r", "", "t", "step.started", b"{}"),  # a seq that is not an int
    (True, "r", "", "t", "step.started", b"{}"),  # an int subclass
    (1, "r", "", "t", "step.started"),  # five fields
    (1, "r", "", "t", "step.started", b"{}", b""),  # seven
    [1, "r", "", "t", "step.started", b"{}"],  # not a tuple
], ids=["null-text", "number-text", "blob-text", "null-payload", "text-payload",
        "real-seq", "bool-seq", "five", "seven", "list"])
def test_a_row_not_in_the_runtimes_own_types_gives_no_page(row: Any) -> None:
    good = (1, "r", "", "t", "step.started", b"{}")
    assert events_of([good, row, good], EVENT_CLASS) is None


def test_a_class_without_a_tuples_layout_is_refused() -> None:
    class WithDict(tuple):  # type: ignore[type-arg]
        pass

    class WithDel(tuple):  # type: ignore[type-arg]
        __slots__ = ()

        def __del__(self) -> None:
            pass

    # Struct sequences have a tuple's layout but free as many items as their
    # type has fields: a row of six turned into one was freed past its end.
    for cls in (tuple, WithDict, WithDel, list, object, "Event", os.stat_result,
                time.struct_time, os.terminal_size):
        with pytest.raises(TypeError, match="tuple subclass"):
            events_of([], cls)


def test_the_event_class_is_held_by_each_event_and_let_go_when_it_dies() -> None:
    """An instance of a class made by a class statement holds a reference to it,
    given back when the instance dies: a retyped row must take one."""
    gc.collect()
    before = sys.getrefcount(EVENT_CLASS)
    held = events_of(FreshRows(1000), EVENT_CLASS)
    copied = events_of(list(FreshRows(1000)), EVENT_CLASS)
    assert held is not None and copied is not None
    assert sys.getrefcount(EVENT_CLASS) == before + 2000
    del held, copied
    gc.collect()
    assert sys.getrefcount(EVENT_CLASS) == before


def test_an_error_while_reading_rows_is_raised_and_the_rows_read_are_freed() -> None:
    def failing() -> Iterator[tuple[Any, ...]]:
        yield from FreshRows(5)
        raise OSError("the disk went away")

    gc.collect()
    before = sys.getrefcount(EVENT_CLASS)
    with pytest.raises(OSError, match="the disk went away"):
        events_of(failing(), EVENT_CLASS)
    gc.collect()
    assert sys.getrefcount(EVENT_CLASS) == before


# Every column is NOT NULL with TEXT affinity: a number is stored as its text,
# a blob as a blob, the one other storage class a row can hold there.
_STORED = st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False),
                    st.text(max_size=8), st.binary(max_size=8))


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(_STORED, _STORED, _STORED, _STORED, _STORED), min_size=1,
                     max_size=6))
def test_the_store_reads_any_stored_row_the_same_with_the_module_as_without(
        rows: list[tuple[Any, ...]],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rows with blobs, invalid UTF-8 and numbers in any column (written by
    hand: appends store only the runtime's types), read by the module's query
    and, with the module gone, by the converting one."""
    path = str(tmp_path_factory.mktemp("rows") / "a.db")
    with open_store(path) as store:
        with store.tx() as tx:
            insert_run(tx, "r")
            tx.execute("INSERT INTO events (run_id, step_id, at, type, payload_json) "
                       "VALUES ('r', '', '2026-12-01T09:00:00Z', 'step.started', '{}')")
            for row in rows:
                tx.execute("INSERT OR IGNORE INTO runs (id, goal, status, limits_json, "
                           "created_at) VALUES (?, 'g', 'RUNNING', '{}', "
                           "'2026-10-01T09:00:00Z')", row[:1])
                tx.execute("INSERT INTO events (run_id, step_id, at, type, payload_json) "
                           "VALUES (?, ?, ?, ?, ?)", row)
        with_module = [store.list_events_after("", 0, 50), store.list_events_after("r", 0, 50)]
        with mock.patch.object(pages, "_events_of", None):
            without = [store.list_events_after("", 0, 50), store.list_events_after("r", 0, 50)]
    assert with_module == without
    assert [[type(e) for e in page] for page in with_module] == [
        [EVENT_CLASS] * len(page) for page in without]


def test_the_store_builds_its_page_with_the_module(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Any) -> None:
    calls: list[int] = []

    def counted(rows: Any, cls: Any) -> Any:
        calls.append(1)
        return events_of(rows, cls)

    monkeypatch.setattr(pages, "_events_of", counted)
    with open_store(str(tmp_path / "a.db")) as store:
        with store.tx() as tx:
            insert_run(tx, "r")
            tx.append("r", "", datetime(2026, 12, 1, tzinfo=UTC), "step.started", b"{}")
        assert [e.type for e in store.list_events_after("", 0, 10)] == ["step.started"]
    assert calls == [1]


ASAN_CHILD = r"""
import gc, importlib.util, sys
from unittest import mock
spec = importlib.util.spec_from_file_location("agentrt._eventrows", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
from agentrt import open_existing
from agentrt.events import event_from_fields
from agentrt.store import pages
gc.collect()
before = sys.getrefcount(event_from_fields)
with mock.patch.object(pages, "_events_of", module.events_of), open_existing(sys.argv[2]) as store:
    expected = [tuple(e) for e in store.list_events_after("", 0, 100_000)]
    for size in (1, 7, 500):  # pages read, kept, dropped, compared field by field
        seq, read = 0, []
        while page := store.list_events_after("", seq, size):
            read.extend(page)
            seq = page[-1].seq
        if [tuple(e) for e in read] != expected or {type(e) for e in read} != {event_from_fields}:
            sys.exit(f"pages of {size} read other events")
        copies = module.events_of(list(map(tuple, read)), event_from_fields)
        del read, copies
gc.collect()
if sys.getrefcount(event_from_fields) != before:
    sys.exit("the event class lost or kept references")
print("ok", len(expected))
"""


def test_the_page_builder_touches_no_freed_memory_under_asan(tmp_path: Path) -> None:
    """Every fixture event read in pages through an AddressSanitizer build, with
    every Python object in ASan's heap: a row freed while its event is in use,
    or the event class freed early, aborts the child."""
    child = run_under_asan(tmp_path, "_eventrows", ASAN_CHILD,
                           copy_fixture(tmp_path / "db"))
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.startswith("ok ")


def test_an_event_is_left_out_of_the_garbage_collector_as_a_tuple_of_atoms_is() -> None:
    """It holds only an int, str and bytes, so it cannot be part of a cycle; a
    tracked page would be traversed by every older collection it outlives."""
    held = events_of(FreshRows(3), EVENT_CLASS)
    copied = events_of(list(FreshRows(3)), EVENT_CLASS)
    assert held is not None and copied is not None
    assert not any(gc.is_tracked(e) for e in held + copied)
    gc.collect()  # and a collection with them alive and untracked changes nothing
    assert [e.seq for e in held + copied] == [1, 2, 3, 1, 2, 3]


def _traced_cursor(seen: list[int]) -> type[apsw.Cursor]:
    class Traced(apsw.Cursor):
        """A consumer's cursor (apsw's cursor_factory) tracing its rows as lists."""

        def __init__(self, conn: apsw.Connection) -> None:
            super().__init__(conn)
            self.row_trace = lambda _cursor, row: (seen.append(row[0]), list(row))[1]

    return Traced


@pytest.mark.parametrize("where", ["connection", "cursor factory"])
def test_a_row_tracer_a_consumer_set_sees_each_row_of_a_page_once(tmp_path: Path,
                                                                  where: str) -> None:
    """A consumer's tracer on ``store.db()`` or on the cursors it makes returns
    rows of its own (here lists): the page is built from them as before, read
    by one query, each row once."""
    with open_store(str(tmp_path / "a.db")) as store:
        with store.tx() as tx:
            insert_run(tx, "r")
            for i in range(4):
                tx.append("r", "", datetime(2026, 12, 1, tzinfo=UTC), "step.started",
                          b'{"i":%d}' % i)
        seen: list[int] = []
        statements: list[str] = []
        conn = store.db()
        if where == "connection":
            conn.row_trace = lambda _cursor, row: (seen.append(row[0]), list(row))[1]
        else:
            conn.cursor_factory = _traced_cursor(seen)
        conn.exec_trace = lambda _cursor, sql, _bindings: (statements.append(sql), True)[1]
        try:
            page = store.list_events_after("", 0, 3)
        finally:
            conn.row_trace = conn.exec_trace = None
            conn.cursor_factory = apsw.Cursor
    assert [e.seq for e in page] == seen == [1, 2, 3]
    assert len(statements) == 1
    assert all(type(e) is EVENT_CLASS for e in page)
