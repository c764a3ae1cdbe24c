"""Bad input to the public Python API of the store, the exporter and the OTel sink
gets one clear sentence, at the call that received it, and changes nothing."""

from __future__ import annotations

import io
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import apsw
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentrt.errors import AgentrtError, NotFoundError
from agentrt.store import (
    PageError,
    Store,
    StoreClosedError,
    StoreOpenError,
    TransactionOpenError,
    open_existing,
    open_store,
)
from agentrt_export import (
    CursorError,
    CursorSeqError,
    FileCursor,
    Follower,
    FollowError,
    JSONLSink,
    MemoryCursor,
)
from agentrt_otel import Backoff, ConfigError, OTelSink, SpanMapper, span_id, trace_id
from agentrt_otel.testing import EventStream, scenario_completed

T0 = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)


def _add_run(store: Store, run_id: str) -> None:
    with store.tx() as tx:
        tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                   "VALUES (?, 'g', 'RUNNING', '{}', '2026-10-01T09:00:00Z')", (run_id,))
        tx.append(run_id, "", T0, "run.created", {"goal": "g"})
        tx.append(run_id, "", T0, "run.started", {})


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "a.db")


@pytest.fixture
def store(db_path: str) -> Store:
    s = open_store(db_path)
    _add_run(s, "r")
    return s


def _one_sentence(exc: BaseException, *names: str) -> str:
    """The message, checked to be one line that names each of ``names``."""
    text = str(exc)
    assert "\n" not in text
    for name in names:
        assert name in text, (name, text)
    text.encode("utf-8")  # printable: no lone surrogate in it
    return text


# -- 1. the OTel sink and its backoff -----------------------------------------------


@pytest.mark.parametrize("exporter", ["http://127.0.0.1:4318", object()],
                         ids=["a URL", "an object"])
def test_otel_sink_refuses_an_exporter_without_export_and_shutdown(exporter: Any) -> None:
    # Before: every export raised AttributeError, retried as an outage for ever.
    with pytest.raises(ConfigError) as info:
        OTelSink(exporter)
    _one_sentence(info.value, "exporter", "export", "shutdown")


def test_otel_sink_refuses_a_resource_that_is_not_an_opentelemetry_resource() -> None:
    with pytest.raises(ConfigError) as info:
        OTelSink(InMemorySpanExporter(), resource="svc")  # type: ignore[arg-type]
    _one_sentence(info.value, "resource", "Resource")
    OTelSink(InMemorySpanExporter(), resource=Resource.create({"service.name": "svc"}))


@pytest.mark.parametrize("name", ["max_batch", "max_text"])
@pytest.mark.parametrize("value", [1.5, None, "5", 0, -1, True])
def test_otel_sink_refuses_a_batch_or_text_cap_that_is_not_a_positive_int(
        name: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        OTelSink(InMemorySpanExporter(), **{name: value})
    _one_sentence(info.value, name)


@pytest.mark.parametrize(("kw", "named"), [
    ({"source": "x.db"}, "source"),
    ({"stop": True}, "stop"),
    ({"backoff": "fast"}, "backoff"),
    ({"mapper": object()}, "mapper"),
    ({"complaints": object()}, "complaints"),
    ({"local_stream": "yes"}, "local_stream"),
])
def test_otel_sink_refuses_other_arguments_of_the_wrong_kind(kw: dict[str, Any],
                                                             named: str) -> None:
    with pytest.raises(ConfigError) as info:
        OTelSink(InMemorySpanExporter(), **kw)
    _one_sentence(info.value, named)


@pytest.mark.parametrize(("kw", "named"), [
    ({"initial": 0, "maximum": 0}, "initial"),  # spun at 100% CPU against a failing exporter
    ({"initial": -5}, "initial"),
    ({"initial": float("nan")}, "initial"),
    ({"jitter": 5}, "jitter"),
    ({"jitter": -0.1}, "jitter"),
    ({"jitter": 1}, "jitter"),
    ({"initial": 10.0, "maximum": 1.0}, "maximum"),
    ({"maximum": float("inf")}, "maximum"),
    ({"initial": "fast"}, "initial"),
    ({"initial": True}, "initial"),
])
def test_backoff_refuses_waits_that_would_spin_or_mean_nothing(kw: dict[str, Any],
                                                               named: str) -> None:
    with pytest.raises(ConfigError) as info:
        Backoff(**kw)
    _one_sentence(info.value, "backoff", named)


def test_backoff_positional_string_is_refused() -> None:
    with pytest.raises(ConfigError, match="initial"):
        Backoff("fast")  # type: ignore[arg-type]
    assert Backoff(initial=1, maximum=1, jitter=0).delay(5) == 1


def test_otel_sink_stops_on_an_export_result_that_is_not_a_span_export_result() -> None:
    class SaysSuccess(SpanExporter):
        def __init__(self) -> None:
            self.calls = 0

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            self.calls += 1
            return "SUCCESS"  # type: ignore[return-value]

        def shutdown(self) -> None:
            pass

    exporter = SaysSuccess()
    stop = threading.Event()
    sink = OTelSink(exporter, stop=stop, backoff=Backoff(initial=0.001, maximum=0.001))
    raised: list[BaseException] = []
    events = EventStream("r")
    scenario_completed(events)

    def page() -> None:
        try:
            sink.handle_page(events.events)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            raised.append(exc)

    worker = threading.Thread(target=page, daemon=True)
    worker.start()
    worker.join(5)
    stop.set()  # before: retried for ever as an outage
    worker.join(5)
    assert raised and isinstance(raised[0], ConfigError), raised
    _one_sentence(raised[0], "export()", "SpanExportResult")
    assert exporter.calls == 1 and sink.pending > 0  # nothing counted as delivered


# -- 2. opening a store --------------------------------------------------------------


def test_open_store_and_open_existing_accept_a_path_like(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    with open_store(path) as store:
        assert store.path == str(path)
        _add_run(store, "r")
    with open_existing(path) as store:
        assert store.get_run("r").id == "r"
    with open_existing(path, read_only=False) as store:
        assert not store.read_only


@pytest.mark.parametrize("path", [b"/x/a.db", None, 5], ids=["bytes", "None", "int"])
def test_open_store_refuses_a_path_of_another_type_before_creating_a_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: Any) -> None:
    monkeypatch.chdir(tmp_path)
    if isinstance(path, bytes):
        path = os.fsencode(tmp_path / "b.db")
    for opener in (open_store, open_existing):
        with pytest.raises(TypeError) as info:
            opener(path)
        _one_sentence(info.value, opener.__name__, "path", "str or os.PathLike")
    assert os.listdir(tmp_path) == []  # before: bytes left an empty 0600 file behind


def test_open_store_and_open_existing_say_the_path_is_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for opener in (open_store, open_existing):
        with pytest.raises(StoreOpenError) as info:
            opener("")
        assert "path is empty" in _one_sentence(info.value)
    assert os.listdir(tmp_path) == []


def test_open_store_refuses_a_path_with_a_nul_character(tmp_path: Path) -> None:
    with pytest.raises(StoreOpenError, match="NUL"):
        open_store(str(tmp_path / "a\x00b.db"))
    assert os.listdir(tmp_path) == []


def test_open_existing_refuses_a_read_only_that_is_not_a_bool(db_path: str) -> None:
    open_store(db_path).close()
    with pytest.raises(TypeError) as info:
        open_existing(db_path, read_only="no")  # type: ignore[arg-type]
    _one_sentence(info.value, "read_only")


# -- 3. calls on the store --------------------------------------------------------


def _enter_tx(s: Store) -> None:
    with s.tx():
        pass


def _locked_read(s: Store) -> None:
    with s.locked() as conn:
        conn.execute("SELECT 1").fetchall()


CLOSED_CALLS: list[tuple[str, Callable[[Store], object]]] = [
    ("get_run", lambda s: s.get_run("r")),
    ("list_runs", lambda s: s.list_runs()),
    ("list_events", lambda s: s.list_events("r")),
    ("tx", _enter_tx),
    ("read_row", lambda s: s.read_row("SELECT 1", ())),
    ("locked", _locked_read),
    ("list_runs_page", lambda s: s.list_runs_page(10, 0)),
    ("get_run_capped", lambda s: s.get_run_capped("r")),
    ("list_events_after", lambda s: s.list_events_after("", 0, 10)),
    ("pending_approval_ids_of", lambda s: s.pending_approval_ids_of(["r"], 5)),
    ("approval_reason", lambda s: s.approval_reason("r", "a")),
    ("approval_reasons", lambda s: s.approval_reasons("r", ["a"])),
    ("tool_spec", lambda s: s.tool_spec("h")),
    ("lease", lambda s: s.lease("r")),
    ("chain_head", lambda s: s.chain_head()),
    ("event_hash", lambda s: s.event_hash(1)),
    ("verify_events", lambda s: s.verify_events()),
    ("data_version", lambda s: s.data_version()),
]


@pytest.mark.parametrize(("name", "call"), CLOSED_CALLS, ids=[n for n, _ in CLOSED_CALLS])
def test_a_call_on_a_closed_store_says_the_store_is_closed(
        store: Store, name: str, call: Callable[[Store], object]) -> None:
    store.close()
    with pytest.raises(StoreClosedError) as info:
        call(store)
    assert isinstance(info.value, AgentrtError)
    assert isinstance(info.value, apsw.ConnectionClosedError)  # what was raised before
    assert "the store is closed" in _one_sentence(info.value)


def test_a_closed_store_is_said_closed_after_a_read_only_open_too(db_path: str) -> None:
    open_store(db_path).close()
    reader = open_existing(db_path)
    reader.close()
    with pytest.raises(StoreClosedError, match=db_path):
        reader.list_events_after("", 0, 10)


def test_a_lone_surrogate_id_is_looked_up_as_stored(store: Store) -> None:
    # Before: UnicodeEncodeError. SQLite cannot hold a lone surrogate; writes
    # store U+FFFD for one, so a read looks for that.
    with pytest.raises(NotFoundError) as info:
        store.get_run("\ud800")
    _one_sentence(info.value, "run")
    with pytest.raises(NotFoundError):
        store.get_approval("\ud800", "a\udc00")
    with pytest.raises(NotFoundError):
        store.lease("\ud800")
    with pytest.raises(NotFoundError):
        store.get_run_capped("\ud800")
    assert store.list_events("\ud800") == []
    assert store.list_events_after("\ud800", 0, 10) == []
    _add_run(store, "x\ufffd")
    assert store.get_run("x\ud800").id == "x\ufffd"
    with store.tx() as tx:
        tx.execute("INSERT INTO approvals (id, run_id, step_id, kind, capability_json, "
                   "presentation_json, request_json, hash, status, created_at) VALUES "
                   "('a\ufffd', 'x\ufffd', 's', 'destructive', '{}', '{}', '{}', 'h', "
                   "'pending', '2026-10-01T09:00:00Z')")
    assert store.approval_reasons("x\ud800", ["a\udc00"]) == {"a\udc00": ""}
    assert store.approval_reason("x\ud800", "a\udc00") == ""
    assert len(store.list_events_after("x\ud800", 0, 10)) == 2
    # Page reads count their total the same way (before: UnicodeEncodeError).
    assert [a.id for a in store.list_approvals_page("x\ud800", "", 5, 0)[0]] == ["a\ufffd"]
    assert store.list_approvals_page("x\ud800", "", 5, 0)[1] == 1
    # An id with a lone surrogate was not stored so: the offset decides.
    assert [a.id for a in store.list_approvals_page("x\ud800", "", 5, 0,
                                                    after_id="a\udc00")[0]] == ["a\ufffd"]
    assert store.list_steps_page("x\ud800", 5, 0) == ([], 0)
    assert store.list_events_page("x\ud800", 5, 0)[1] == 2


@pytest.mark.parametrize("run_id", [None, 5, b"r"])
def test_a_run_id_that_is_not_a_str_is_said_so(store: Store, run_id: Any) -> None:
    for call in (store.get_run, store.lease, store.get_run_capped):
        with pytest.raises(TypeError) as info:
            call(run_id)
        _one_sentence(info.value, "run_id", "not a str")


PAGE_CALLS: list[tuple[str, Callable[[Store, Any, Any], object]]] = [
    ("runs", lambda s, limit, offset: s.list_runs_page(limit, offset)),
    ("steps", lambda s, limit, offset: s.list_steps_page("r", limit, offset)),
    ("approvals", lambda s, limit, offset: s.list_approvals_page("r", "", limit, offset)),
    ("events", lambda s, limit, offset: s.list_events_page("r", limit, offset)),
]


@pytest.mark.parametrize(("what", "call"), PAGE_CALLS, ids=[w for w, _ in PAGE_CALLS])
@pytest.mark.parametrize(("limit", "offset", "named"), [
    (2**70, 0, "limit"),  # before: OverflowError
    (1.5, 0, "limit"),  # before: apsw.MismatchError
    ("10", 0, "limit"),  # before: TypeError from a comparison
    (None, 0, "limit"),
    (10, 2**70, "offset"),
    (10, 1.5, "offset"),
    (10, "0", "offset"),
])
def test_page_reads_refuse_a_limit_or_offset_that_is_not_an_int_in_range(
        store: Store, what: str, call: Callable[[Store, Any, Any], object],
        limit: Any, offset: Any, named: str) -> None:
    with pytest.raises(PageError) as info:
        call(store, limit, offset)
    text = _one_sentence(info.value, f"list {what}", named)
    assert text.startswith("agentrt: list ")


@pytest.mark.parametrize(("run_id", "seq", "limit", "named"), [
    ("", 0, 2**70, "limit"),
    ("", 0, 1.5, "limit"),
    ("", 0, "10", "limit"),
    ("", 0, None, "limit"),
    ("", 2**70, 10, "seq"),
    ("", None, 10, "seq"),  # before: an empty page, for ever
    ("", "abc", 10, "seq"),
    (5, 0, 10, "run_id"),  # before: an empty page, for ever
])
def test_list_events_after_refuses_arguments_it_cannot_use(
        store: Store, run_id: Any, seq: Any, limit: Any, named: str) -> None:
    with pytest.raises(PageError) as info:
        store.list_events_after(run_id, seq, limit)
    _one_sentence(info.value, "list events", named)


def test_list_events_after_still_reads_what_it_read(store: Store) -> None:
    assert [e.seq for e in store.list_events_after("", 0, 10)] == [1, 2]
    assert [e.seq for e in store.list_events_after("r", -5, 10)] == [1, 2]
    assert [e.seq for e in store.list_events_after("", 1, 10)] == [2]
    assert store.list_events_after("", 2, 10) == []
    assert store.list_events_after("nobody", 0, 10) == []


@pytest.mark.parametrize(("args", "named", "error"), [
    (("1",), "from_seq", TypeError),  # before: TypeError from a comparison
    ((1.5,), "from_seq", TypeError),  # before: a report from seq 1.5
    ((True,), "from_seq", TypeError),
    ((0, "2"), "to_seq", TypeError),
    ((2**70,), "from_seq", ValueError),
])
def test_verify_events_requires_int_seqs(store: Store, args: tuple[Any, ...], named: str,
                                         error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        store.verify_events(*args)
    _one_sentence(info.value, named)
    assert store.verify_events(-5, 0).intact  # < 1 still means from the start, to the head


@pytest.mark.parametrize("seq", ["1", 1.5, 2**70])
def test_event_hash_requires_an_int_seq(store: Store, seq: Any) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        store.event_hash(seq)
    _one_sentence(info.value, "seq")


def test_pending_approval_ids_of_refuses_one_str_for_many_ids(store: Store) -> None:
    with pytest.raises(TypeError) as info:
        store.pending_approval_ids_of("r", 5)  # type: ignore[arg-type]
    _one_sentence(info.value, "run_ids")


@pytest.mark.parametrize("per_run", [2**63, "2", 1.5, None])
def test_pending_approval_ids_of_names_a_per_run_that_is_not_a_count(
        store: Store, per_run: Any) -> None:
    with pytest.raises(AgentrtError) as info:
        store.pending_approval_ids_of(["r"], per_run)
    _one_sentence(info.value, "per_run")


def test_pending_approval_ids_of_more_runs_than_sqlite_binds_in_one_query(store: Store) -> None:
    """SQLite binds at most 32,766 values a statement: the ids go in several queries."""
    with store.tx() as tx:
        tx.execute("UPDATE runs SET status = 'WAITING_FOR_APPROVAL' WHERE id = 'r'")
        tx.execute("INSERT INTO approvals (id, run_id, step_id, kind, capability_json, "
                   "presentation_json, request_json, hash, status, created_at) VALUES "
                   "('ap', 'r', 's', 'k', '{}', '{}', '{}', 'h', 'pending', 't')")
    ids = [f"gone-{i}" for i in range(40_000)] + ["r"]
    assert store.pending_approval_ids_of(ids, 2) == {"r": ["ap"]}
    assert store.pending_approval_ids_of(set(ids), 2) == {"r": ["ap"]}  # no slices of a set
    assert store.pending_approval_ids_of(dict.fromkeys(ids).keys(), 2) == {"r": ["ap"]}


# -- 4. appending events ---------------------------------------------------------


def _append_fails(store: Store, error: type[Exception], *names: str, **kw: Any) -> str:
    """Append with ``kw`` over good arguments; it must raise ``error`` naming
    ``names`` and leave the database as it was (the transaction rolls back)."""
    args: dict[str, Any] = {"run_id": "r", "step_id": "", "at": T0, "type": "x.y",
                            "payload": {}}
    args.update(kw)
    before = store.chain_head()
    with pytest.raises(error) as info, store.tx() as tx:
        tx.execute("UPDATE runs SET goal = 'changed' WHERE id = 'r'")
        tx.append(**args)
    assert store.chain_head() == before
    assert store.get_run("r").goal == "g"
    return _one_sentence(info.value, *names)


@pytest.mark.parametrize("payload", ['{"a":1}', {1, 2}, [1, 2], 5, 1.5, bytearray(b"{}")],
                         ids=["str", "set", "list", "int", "float", "bytearray"])
def test_append_refuses_a_payload_that_is_not_bytes_a_dict_or_none(
        store: Store, payload: Any) -> None:
    text = _append_fails(store, TypeError, "payload", type(payload).__name__,
                         payload=payload)
    if isinstance(payload, str):
        assert ".encode()" in text


@pytest.mark.parametrize(("payload", "where"), [
    ({1: "a"}, "key"),
    ({"a": {(1, 2): "b"}}, "payload['a']"),
    ({"a": 1.5}, "payload['a']"),  # before: "cannot encode float as JSON", no key
    ({"a": [1, {"b": float("nan")}]}, "payload['a'][1]['b']"),
    ({"a": object()}, "payload['a']"),
    ({"a": datetime(2026, 1, 1)}, "payload['a']"),
])
def test_append_names_where_a_dict_payload_will_not_encode(store: Store, payload: Any,
                                                           where: str) -> None:
    _append_fails(store, TypeError, where, payload=payload)


def test_append_says_a_dict_payload_holds_itself() -> None:
    with open_store(":memory:") as store:
        _add_run(store, "r")
        cycle: dict[str, Any] = {}
        cycle["a"] = [cycle]
        _append_fails(store, TypeError, "payload['a'][0]", "cycle", payload=cycle)


@pytest.mark.parametrize("payload", [b"hello", b"\xff\xfe", b'{"a":NaN}', b'{"a":1} x',
                                     b'{"a":'],
                         ids=["text", "not UTF-8", "NaN", "trailing", "cut"])
def test_append_refuses_bytes_that_are_not_json(store: Store, payload: bytes) -> None:
    # Before: stored as they were (b"hello"), or a bare UnicodeDecodeError.
    _append_fails(store, ValueError, "payload", payload=payload)


@pytest.mark.parametrize("payload", [b'{"big":1e400}', b'"\\ud800"', b' {"a" : [1, 2]}\n',
                                     b"12345678901234567890123", b"", b"  "])
def test_append_keeps_json_the_fast_check_refuses_and_blank_payloads(
        store: Store, payload: bytes) -> None:
    with store.tx() as tx:
        event = tx.append("r", "", T0, "x.y", payload)
    assert event.payload == (payload if payload.strip() else b"{}")
    assert store.verify_events().intact


@pytest.mark.parametrize(("at", "error"), [
    (None, TypeError),  # before: stored as '' and read back as year 1
    ("2026-01-01T00:00:00Z", TypeError),  # before: AttributeError 'tzinfo'
    (date(2026, 1, 1), TypeError),
    (datetime(2026, 1, 1), ValueError),
    (datetime(1, 1, 1, tzinfo=UTC), ValueError),
])
def test_append_requires_an_aware_datetime(store: Store, at: Any,
                                           error: type[Exception]) -> None:
    _append_fails(store, error, "at", at=at)


@pytest.mark.parametrize(("kw", "named", "error"), [
    ({"type": None}, "type", TypeError),  # before: stored as "None"
    ({"type": ""}, "type", ValueError),  # before: accepted
    ({"type": 5}, "type", TypeError),
    ({"run_id": None}, "run_id", TypeError),
    ({"run_id": ""}, "run_id", ValueError),
    ({"run_id": b"r"}, "run_id", TypeError),
    ({"step_id": None}, "step_id", TypeError),
])
def test_append_requires_str_names_and_a_run_and_type(store: Store, kw: dict[str, Any],
                                                      named: str,
                                                      error: type[Exception]) -> None:
    _append_fails(store, error, named, **kw)


def test_append_stores_a_str_enum_type_as_its_value(store: Store) -> None:
    class Kind(StrEnum):
        CREATED = "x.created"

    with store.tx() as tx:
        event = tx.append("r", "", T0, Kind.CREATED, None)
    assert type(event.type) is str and event.type == "x.created"
    assert store.list_events("r")[-1].type == "x.created"
    assert store.verify_events().intact


def test_a_transaction_inside_another_says_so_and_changes_nothing(store: Store) -> None:
    before = store.chain_head()
    with pytest.raises(TransactionOpenError) as info, store.tx() as outer:
        outer.append("r", "", T0, "x.y", {})
        with store.tx() as inner:  # before: apsw.SQLError
            inner.append("r", "", T0, "x.y", {})
    assert isinstance(info.value, AgentrtError)
    assert isinstance(info.value, apsw.SQLError)
    _one_sentence(info.value, "transaction", "store.tx()")
    assert store.chain_head() == before
    with store.tx() as tx:  # the store goes on
        tx.append("r", "", T0, "x.y", {})
    assert store.chain_head()[0] == before[0] + 1


# -- 5. the follower, its cursors and sinks ----------------------------------------------


@pytest.fixture
def reader(store: Store, db_path: str) -> Store:
    store.close()
    return open_existing(db_path)


@pytest.mark.parametrize("page_size", [1.5, "10", None, True])
def test_follower_refuses_a_page_size_that_is_not_an_int(reader: Store,
                                                         page_size: Any) -> None:
    # Before: apsw.MismatchError (1.5) or a TypeError at follow.
    with pytest.raises(FollowError) as info:
        Follower(reader, page_size=page_size)
    _one_sentence(info.value, "page size")


@pytest.mark.parametrize("interval", ["x", True, [1]])
def test_follower_refuses_an_interval_that_is_not_a_number(reader: Store,
                                                           interval: Any) -> None:
    with pytest.raises(FollowError) as info:
        Follower(reader, interval=interval)
    _one_sentence(info.value, "interval")


@pytest.mark.parametrize("cursor", [5, "/tmp/x.cursor", object()])
def test_follower_refuses_a_cursor_that_is_not_a_cursor(reader: Store, cursor: Any) -> None:
    # Before: AttributeError at follow.
    with pytest.raises(FollowError) as info:
        Follower(reader, cursor=cursor)
    text = _one_sentence(info.value, "cursor", "load()", "save(seq)")
    if isinstance(cursor, str):
        assert "FileCursor(path)" in text


def test_follower_refuses_a_store_that_is_not_a_store(db_path: str, reader: Store) -> None:
    with pytest.raises(FollowError) as info:
        Follower(db_path)  # type: ignore[arg-type]
    _one_sentence(info.value, "store", "open_existing")


@pytest.mark.parametrize(("kw", "named"), [
    ({"run_id": 5}, "run_id"),
    ({"once": "yes"}, "once"),
    ({"on_page": 5}, "on_page"),
])
def test_follower_refuses_other_settings_of_the_wrong_kind(reader: Store, kw: dict[str, Any],
                                                           named: str) -> None:
    with pytest.raises(FollowError) as info:
        Follower(reader, **kw)
    _one_sentence(info.value, named)


def test_follow_refuses_a_sink_or_stop_of_the_wrong_kind(reader: Store) -> None:
    cursor = MemoryCursor()
    follower = Follower(reader, cursor=cursor, once=True)
    with pytest.raises(FollowError) as info:
        follower.follow(5)  # type: ignore[arg-type]
    _one_sentence(info.value, "sink")
    with pytest.raises(FollowError, match="stop"):
        follower.follow(lambda e: None, stop=True)  # type: ignore[arg-type]
    assert cursor.seq == 0


@pytest.mark.parametrize("seq", ["3", None, 1.5, -1, True])
def test_memory_cursor_refuses_a_seq_that_is_not_a_whole_number(seq: Any) -> None:
    # Before: a TypeError at follow ("3", None), or seq 1 skipped (1.5).
    with pytest.raises(CursorError) as info:
        MemoryCursor(seq)
    _one_sentence(info.value, "seq")
    cursor = MemoryCursor(2)
    with pytest.raises(CursorError):
        cursor.save(seq)
    assert cursor.load() == 2


@pytest.mark.parametrize("seq", ["5", 1.5, True, 2**70])
def test_file_cursor_save_refuses_a_seq_that_is_not_an_int_in_range(tmp_path: Path,
                                                                     seq: Any) -> None:
    # Before: save(1.5) and save(True) wrote "1".
    cursor = FileCursor(tmp_path / "c")
    cursor.save(3)
    with pytest.raises(CursorError) as info:
        cursor.save(seq)
    assert isinstance(info.value, ValueError)  # as save(-1) raised before
    _one_sentence(info.value, "seq", str(tmp_path / "c"))
    assert cursor.load() == 3
    assert sorted(os.listdir(tmp_path)) == ["c"]


@pytest.mark.parametrize("path", ["", None, 5, b"c"])
def test_file_cursor_refuses_a_path_that_names_no_file(path: Any) -> None:
    # Before: '' was said as "cursor file  names a directory" at follow.
    with pytest.raises(CursorError) as info:
        FileCursor(path)
    text = _one_sentence(info.value, "cursor file path")
    if path == "":
        assert "empty" in text


@pytest.mark.parametrize("stream", [None, "out.jsonl", 1], ids=["None", "a path", "an fd"])
def test_jsonl_sink_refuses_what_is_not_a_stream(stream: Any) -> None:
    # Before: accepted, and the first event failed at follow.
    with pytest.raises(FollowError) as info:
        JSONLSink(stream)
    text = _one_sentence(info.value, "JSONLSink", "write()")
    if isinstance(stream, str):
        assert "open(" in text


def test_jsonl_sink_refuses_a_closed_stream() -> None:
    closed = io.BytesIO()
    closed.close()
    with pytest.raises(FollowError, match="closed"):
        JSONLSink(closed)


# -- 6. span and trace ids -------------------------------------------------------------


@pytest.mark.parametrize(("call", "named"), [
    (lambda: trace_id(5), "run_id"),  # type: ignore[arg-type]
    (lambda: trace_id(None), "run_id"),  # type: ignore[arg-type]
    (lambda: trace_id(b"r"), "run_id"),  # type: ignore[arg-type]
    (lambda: span_id("run", 5), "id"),  # type: ignore[arg-type]
    (lambda: span_id(None, "x"), "kind"),  # type: ignore[arg-type]
])
def test_trace_and_span_ids_say_which_argument_is_not_a_str(call: Callable[[], int],
                                                            named: str) -> None:
    # Before: AttributeError 'encode'.
    with pytest.raises(TypeError) as info:
        call()
    _one_sentence(info.value, f"{named} is", "not a str")
    assert trace_id("r") == trace_id("r") and span_id("run", "r") != trace_id("r")


HUGE = 10**5000  # past the 4,300 digits Python writes an int in


@pytest.mark.parametrize(("call", "error"), [
    (lambda s: s.list_approvals_page("r", "", HUGE, 0), PageError),
    (lambda s: s.list_events_page("r", 5, HUGE), PageError),
    (lambda s: s.list_runs_page(-HUGE, 0), PageError),
    (lambda s: MemoryCursor(-HUGE), CursorSeqError),
    (lambda s: FileCursor(os.path.join(tempfile.mkdtemp(), "c")).save(HUGE), CursorSeqError),
    (lambda s: SpanMapper(max_text=-HUGE), ValueError),
    (lambda s: SpanMapper(finished_runs=-HUGE), ValueError),
    (lambda s: Follower(s, cursor=MemoryCursor(HUGE), once=True).follow(lambda e: None),
     FollowError),
])
def test_a_number_of_thousands_of_digits_is_said_in_the_sentence_not_a_conversion_error(
        store: Store, call: Any, error: type) -> None:
    """Python refuses to write such an int, so the sentence itself raised a bare
    'Exceeds the limit (4300 digits)' ValueError instead of the refusal."""
    with pytest.raises(error) as info:
        call(store)
    assert "(a number of" in str(info.value) and "bits)" in str(info.value)
