"""Writes: one transaction per transition, its events chained, observed after commit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import T0, insert_run

from agentrt import Event, chain_hash, open_store
from agentrt.events import EventType
from agentrt.store.tx import encode_payload


@pytest.fixture
def store(tmp_path):
    with open_store(str(tmp_path / "a.db")) as s:
        yield s


class Boom(Exception):
    pass


def test_exception_in_transaction_rolls_back_and_leaves_the_connection_usable(store):
    seen: list[Event] = []
    with pytest.raises(Boom), store.tx(seen.append) as tx:
        insert_run(tx, "r1")
        tx.append("r1", "", T0, "run.created", {})
        raise Boom
    assert store.list_runs() == []
    assert store.list_events("r1") == []
    assert seen == []  # nothing from a rolled-back transaction
    assert not store.db().in_transaction
    with store.tx(seen.append) as tx:  # the connection still works
        insert_run(tx, "r1")
        tx.append("r1", "", T0, "run.created", {})
    assert [e.seq for e in seen] == [1]  # rollback left no gap


def test_base_exceptions_roll_back_too(store):
    with pytest.raises(KeyboardInterrupt), store.tx() as tx:
        insert_run(tx, "r1")
        raise KeyboardInterrupt
    assert store.list_runs() == [] and not store.db().in_transaction


def test_a_failing_statement_rolls_back_the_whole_transition(store):
    with store.tx() as tx:
        insert_run(tx, "r1")
    with pytest.raises(apsw.ConstraintError), store.tx() as tx:
        insert_run(tx, "r2")
        tx.append("r2", "", T0, "run.created", {})
        insert_run(tx, "r1")  # duplicate id
    assert [r.id for r in store.list_runs()] == ["r1"]
    assert store.chain_head() == (0, "")


def test_observer_sees_events_only_after_commit_in_seq_order(tmp_path, store):
    path = str(tmp_path / "a.db")
    seen: list[tuple[Event, int]] = []

    def observer(event: Event) -> None:
        # What the observer is handed is already durable: another connection sees it.
        other = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
        (n,) = other.execute("SELECT COUNT(*) FROM events WHERE seq = ?",
                             (event.seq,)).fetchone()
        other.close()
        seen.append((event, n))

    with store.tx(observer) as tx:
        insert_run(tx, "r1")
        first = tx.append("r1", "", T0, "run.created", {"goal": "g"})
        second = tx.append("r1", "s1", T0 + timedelta(seconds=1), "step.started", None)
        assert seen == []  # not before COMMIT
    assert [e for e, _ in seen] == [first, second]
    assert [n for _, n in seen] == [1, 1]
    assert [e for e, _ in seen] == store.list_events("r1")  # exactly the stored events


def test_observer_error_comes_after_the_commit(store):
    def observer(event: Event) -> None:
        raise Boom

    with pytest.raises(Boom), store.tx(observer) as tx:
        insert_run(tx, "r1")
        tx.append("r1", "", T0, "run.created", {})
    assert [r.id for r in store.list_runs()] == ["r1"]


def test_seq_is_head_plus_one_and_the_hash_chains_across_runs(store):
    with store.tx() as tx:
        insert_run(tx, "a")
        insert_run(tx, "b")
        a1 = tx.append("a", "", T0, "run.created", {"goal": "x"})
        b1 = tx.append("b", "", T0, "run.created", {"goal": "y"})
    with store.tx() as tx:
        a2 = tx.append("a", "s1", T0 + timedelta(microseconds=500), "step.started", b"")
    assert (a1.seq, b1.seq, a2.seq) == (1, 2, 3)
    hashes = [r[0] for r in store.db().execute("SELECT hash FROM events ORDER BY seq")]
    h1 = chain_hash("", 1, "a", "", "2026-10-01T09:00:00Z", "run.created", b'{"goal":"x"}')
    h2 = chain_hash(h1, 2, "b", "", "2026-10-01T09:00:00Z", "run.created", b'{"goal":"y"}')
    h3 = chain_hash(h2, 3, "a", "s1", "2026-10-01T09:00:00.0005Z", "step.started", b"{}")
    assert hashes == [h1, h2, h3]
    assert store.chain_head() == (3, h3)
    assert store.event_hash(2) == h2


def test_seq_is_never_reused_after_the_newest_events_are_deleted(store):
    with store.tx() as tx:
        insert_run(tx, "r")
        for i in range(5):
            tx.append("r", "", T0, "run.started", {"i": i})
    store.db().execute("DELETE FROM events WHERE seq > 2")  # the tail is cut
    with store.tx() as tx:
        event = tx.append("r", "", T0, "run.resumed", {})
    assert event.seq == 6  # what AUTOINCREMENT would have handed out, never 3
    assert [e.seq for e in store.list_events("r")] == [1, 2, 6]


def _chain_is_intact(store) -> bool:
    report = store.verify_events()
    return report.intact and report.to_seq == store.chain_head()[0]


@pytest.mark.parametrize("between", [
    "other connection appends", "own connection deletes the tail", "plain tx deletes",
    "own-writes tx rolls back", "nothing",
])
def test_own_writes_transactions_reuse_the_head_only_while_no_commit_intervened(
        tmp_path, between):
    path = str(tmp_path / "h.db")
    with open_store(path) as store:
        with store.tx(own_writes=True) as tx:
            insert_run(tx, "r")
            for i in range(3):
                tx.append("r", "", T0, "run.started", {"i": i})
        if between == "other connection appends":
            with open_store(path) as other, other.tx() as tx:
                tx.append("r", "", T0, "run.resumed", {"by": "other"})
        elif between == "own connection deletes the tail":
            store.db().execute("DELETE FROM events WHERE seq = 3")
        elif between == "plain tx deletes":
            with store.tx() as tx:
                tx.execute("DELETE FROM events WHERE seq = 3")
        elif between == "own-writes tx rolls back":
            with pytest.raises(Boom), store.tx(own_writes=True) as tx:
                tx.append("r", "", T0, "run.resumed", {"rolled": "back"})
                raise Boom
        with store.tx(own_writes=True) as tx:
            event = tx.append("r", "", T0, "run.resumed", {})
        expected = {"other connection appends": 5}.get(between, 4)
        assert event.seq == expected  # never a reused seq
        # Deleting the newest events cuts the log's end, which the chain cannot
        # show; the new event still chains to the newest stored one.
        if between not in ("own connection deletes the tail", "plain tx deletes"):
            assert _chain_is_intact(store)
        else:
            prev = store.db().execute("SELECT hash FROM events WHERE seq = 2").fetchone()[0]
            assert store.event_hash(4) == chain_hash(prev, 4, "r", "", "2026-10-01T09:00:00Z",
                                                     "run.resumed", b"{}")


def test_a_transactions_reads_and_appends_leave_no_statement_holding_a_table(store):
    store.db().execute("CREATE TABLE mine (x)")
    store.db().execute("INSERT INTO mine VALUES (1), (2)")
    with store.tx() as tx:
        insert_run(tx, "r")
        assert tx.one("SELECT x FROM mine ORDER BY x") == (1,)  # a second row unread
        tx.append("r", "", T0, "run.started", {})
        tx.execute("DROP TABLE mine")  # a consumer's own schema change, same transaction
    with store.tx(own_writes=True) as tx:
        tx.run("CREATE TABLE mine2 (x)")
        tx.append("r", "", T0, "run.resumed", {})
        tx.run("DROP TABLE mine2")
    assert [e.seq for e in store.list_events("r")] == [1, 2]


def test_event_fields_are_stored_as_given(store):
    with store.tx() as tx:
        insert_run(tx, "r")
        a = tx.append("r", "", datetime(2026, 10, 1, 11, 0, 0, 250000,
                                         tzinfo=UTC).astimezone(), EventType.RUN_STARTED,
                      {"z": 1, "a": "<&>"})
        b = tx.append("r", "", T0, "x.y", b'{"raw":  true}')
    rows = store.db().execute(
        "SELECT at, type, payload_json FROM events ORDER BY seq").fetchall()
    assert rows == [
        ("2026-10-01T11:00:00.25Z", "run.started", '{"z":1,"a":"\\u003c\\u0026\\u003e"}'),
        ("2026-10-01T09:00:00Z", "x.y", '{"raw":  true}'),
    ]
    assert a.at == datetime(2026, 10, 1, 11, 0, 0, 250000, tzinfo=UTC)
    assert type(a.type) is str and a.type == "run.started"
    assert b.payload == b'{"raw":  true}'


def test_empty_payload_is_stored_as_an_empty_object():
    assert encode_payload(None) == b"{}"
    assert encode_payload(b"") == b"{}"
    assert encode_payload(b"  ") == b"{}"
    assert encode_payload({}) == b"{}"


def test_tx_helpers_read_and_count_changes(store):
    with store.tx() as tx:
        insert_run(tx, "r")
        tx.execute("UPDATE runs SET status = 'FAILED' WHERE id = ? AND status = 'RUNNING'",
                   ("r",))
        assert tx.changes() == 1
        tx.execute("UPDATE runs SET status = 'FAILED' WHERE id = ? AND status = 'RUNNING'",
                   ("r",))
        assert tx.changes() == 0  # a compare-and-set that lost
        assert tx.one("SELECT status FROM runs WHERE id = ?", ("r",)) == ("FAILED",)
        assert tx.one("SELECT status FROM runs WHERE id = 'none'") is None


def test_events_of_a_transaction_are_kept_in_append_order(store):
    with store.tx() as tx:
        insert_run(tx, "r")
        for i in range(3):
            tx.append("r", "", T0, "run.started", {"i": i})
        assert [e.seq for e in tx.events] == [1, 2, 3]


def test_store_lock_serialises_threads(store):
    import threading

    with store.tx() as tx:
        insert_run(tx, "r")

    def append_many() -> None:
        for _ in range(20):
            with store.tx() as tx:
                tx.append("r", "", T0, "run.started", {})

    threads = [threading.Thread(target=append_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [e.seq for e in store.list_events("r")] == list(range(1, 81))
    assert store.verify_events().intact


def _isoformat_stored(t: datetime) -> str:
    """The stored time as first written: isoformat of the UTC fields, trimmed."""
    if t.tzinfo is not None:
        t = t.astimezone(UTC)
    text = t.replace(tzinfo=None).isoformat()
    return (text.rstrip("0") if t.microsecond else text) + "Z"


@settings(max_examples=400, deadline=None)
@given(st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31),
                    timezones=st.none() | st.just(UTC) | st.timezones()))
def test_stored_time_is_the_utc_isoformat_with_its_fraction_trimmed(t):
    from agentrt.timefmt import format_time, parse_time

    assert format_time(t) == _isoformat_stored(t)
    assert format_time(t) == format_time(t)  # remembered readings give the same text
    if t.tzinfo is UTC:
        assert parse_time(format_time(t)) == t
