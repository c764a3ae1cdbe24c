"""Transactions at their edges: interrupts, SQL that controls the transaction
itself, parameters SQLite cannot bind, and arguments out of range."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta, timezone

import apsw
import pytest
from store_helpers import T0, insert_run

from agentrt import open_store
from agentrt.store.tx import TransactionEndedError


@pytest.fixture
def path(tmp_path):
    path = str(tmp_path / "a.db")
    with open_store(path) as s, s.tx() as tx:
        insert_run(tx, "r")
    return path


@pytest.fixture
def store(path):
    with open_store(path) as s:
        yield s


def test_ctrl_c_while_begin_waits_for_the_write_lock_leaves_no_transaction_open(path, store):
    """SIGINT arrives while BEGIN IMMEDIATE waits on another connection's lock;
    Python raises it once BEGIN has returned, which may be after it began."""
    other = apsw.Connection(path)
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(1.0, lambda: other.execute("COMMIT"))
    interrupt = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        release.start()
        interrupt.start()
        with pytest.raises(KeyboardInterrupt), store.tx() as tx:
            tx.append("r", "", T0, "never", {})
            time.sleep(5)  # (an interrupt that came only now still ends the test)
    finally:
        interrupt.join()
        release.join()
        signal.signal(signal.SIGINT, previous)
    assert not store.db().in_transaction
    with store.tx() as tx:
        tx.append("r", "", T0, "next", {})
    assert [e.type for e in store.list_events("r")] == ["next"]
    writer = apsw.Connection(path)
    writer.setbusytimeout(500)
    writer.execute("BEGIN IMMEDIATE")  # no lock left behind
    writer.execute("ROLLBACK")


@pytest.mark.parametrize("method", ["execute", "run", "one", "only"])
def test_statements_with_a_lone_surrogate_parameter_each_run_once(store, method):
    """The surrogate is stored as U+FFFD; the statements before the one that
    binds it are not run again."""
    with store.tx() as tx:
        tx.execute("CREATE TABLE notes (n TEXT)")
    with store.tx() as tx:
        getattr(tx, method)("INSERT INTO notes VALUES (?); INSERT INTO notes VALUES (?)",
                            ("first", "bad \ud800"))
        getattr(tx, method)("INSERT INTO notes VALUES (:a); INSERT INTO notes VALUES (:b)",
                            {"a": "third", "b": "\udfff"})
    rows = store.db().execute("SELECT n FROM notes ORDER BY rowid").fetchall()
    assert [r[0] for r in rows] == ["first", "bad \ufffd", "third", "\ufffd"]


def test_a_savepoint_rolled_back_over_appended_events_is_refused_and_nothing_observed(store):
    seen: list = []
    with pytest.raises(TransactionEndedError, match="rolled back whole"), \
            store.tx(seen.append) as tx:
        tx.append("r", "", T0, "one", {})
        tx.execute("SAVEPOINT sp")
        tx.append("r", "", T0, "two", {})
        tx.execute("ROLLBACK TO sp")
        tx.execute("RELEASE sp")
        tx.append("r", "", T0, "three", {})
    assert seen == []
    assert store.list_events("r") == []
    assert not store.db().in_transaction
    with store.tx(seen.append) as tx:
        tx.append("r", "", T0, "next", {})
    assert [e.type for e in seen] == ["next"]
    assert store.verify_events().intact


def test_a_savepoint_rolled_back_over_the_last_appended_event_is_refused(store):
    seen: list = []
    with pytest.raises(TransactionEndedError), store.tx(seen.append) as tx:
        tx.append("r", "", T0, "one", {})
        tx.execute("SAVEPOINT sp")
        tx.append("r", "", T0, "two", {})
        tx.execute("ROLLBACK TO sp")
    assert (seen, store.list_events("r")) == ([], [])


def test_a_savepoint_that_keeps_its_events_commits(store):
    seen: list = []
    with store.tx(seen.append) as tx:
        tx.execute("SAVEPOINT sp")
        tx.append("r", "", T0, "one", {})
        tx.execute("RELEASE sp")
        tx.append("r", "", T0, "two", {})
    assert [e.type for e in seen] == [e.type for e in store.list_events("r")] == ["one", "two"]
    assert store.verify_events().intact


@pytest.mark.parametrize("method", ["execute", "run", "one", "only"])
def test_sql_that_ends_the_transaction_is_refused_at_once_whatever_runs_it(store, method):
    """Before: a ROLLBACK let a later append commit outside any transaction, and
    a COMMIT stored events the observer was never told of, raising SQLite's
    'cannot commit - no transaction is active'."""
    seen: list = []
    with pytest.raises(TransactionEndedError, match="ended the transaction"), \
            store.tx(seen.append) as tx:
        tx.append("r", "", T0, "one", {})
        getattr(tx, method)("ROLLBACK")
        tx.append("r", "", T0, "two", {})
    assert (seen, store.list_events("r")) == ([], [])
    assert store.verify_events().intact and not store.db().in_transaction
    with pytest.raises(TransactionEndedError, match="ended the transaction"), \
            store.tx(seen.append) as tx:
        getattr(tx, method)("COMMIT")
    assert not store.db().in_transaction


@pytest.mark.parametrize("method", ["one", "only"])
def test_a_savepoint_rolled_back_through_one_or_only_is_refused_too(store, method):
    seen: list = []
    with pytest.raises(TransactionEndedError, match="rolled back whole"), \
            store.tx(seen.append) as tx:
        getattr(tx, method)("SAVEPOINT sp")
        tx.append("r", "", T0, "one", {})
        getattr(tx, method)("ROLLBACK TO sp")
        getattr(tx, method)("RELEASE sp")
    assert (seen, store.list_events("r")) == ([], [])


def test_a_write_whose_sql_holds_case_end_is_not_taken_for_transaction_control(store):
    """The runtime's own saturating writes (CASE ... END) once paid the check
    meant for SQL that ends a transaction, on every step."""
    from agentrt.store.tx import _MAY_UNDO, _shape

    assert not _shape("UPDATE runs SET n = CASE WHEN n > 5 THEN 5 ELSE n END WHERE id = ?")
    assert _shape("END") & _MAY_UNDO and _shape("x; rollback to s") & _MAY_UNDO


def _cache_lines() -> list[int]:
    """The lines of Tx.__exit__ that update the own-writes head cache."""
    import inspect

    from agentrt.store.tx import Tx

    lines, first = inspect.getsourcelines(Tx.__exit__)
    return [first + i for i, line in enumerate(lines) if line.strip().startswith("known.")]


@pytest.mark.parametrize("at", range(4))
def test_an_interrupt_while_the_head_cache_is_updated_leaves_no_stale_head(at):
    """Ctrl-C may land between any two of its assignments after the commit."""
    import sys

    from agentrt.store.tx import __file__ as tx_file

    lines = _cache_lines()
    assert len(lines) >= 3
    if at >= len(lines):
        return
    target = lines[at]
    with open_store(":memory:") as s:
        with s.tx() as tx:
            insert_run(tx, "r")

        def own(type_: str) -> None:
            with s.tx(None, own_writes=True) as tx:
                tx.append("r", "", T0, type_, {})

        own("e1")

        def tracer(frame, event, arg):
            if frame.f_code.co_name != "__exit__" or frame.f_code.co_filename != tx_file:
                return None

            def local(f, ev, a):
                if ev == "line" and f.f_lineno == target and not fired:
                    fired.append(target)
                    raise KeyboardInterrupt
                return local
            return local

        fired: list[int] = []
        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            with pytest.raises(KeyboardInterrupt):
                own("e2")
        finally:
            sys.settrace(previous)
        own("e3")
        own("e4")
        assert [e.type for e in s.list_events("r")] == ["e1", "e2", "e3", "e4"]
        assert s.verify_events().intact


def test_a_shared_observer_sees_each_transactions_events_in_order_not_all_in_seq_order(store):
    """The order promised is within one transaction: another thread's commit
    can deliver its event between two of an earlier transaction's."""
    seen: list[int] = []
    first_seen, later_seen = threading.Event(), threading.Event()

    def observer(event):
        seen.append(event.seq)
        if event.seq == 1:
            first_seen.set()
            later_seen.wait(5)
        elif event.seq == 3:
            later_seen.set()

    def earlier():
        with store.tx(observer) as tx:
            tx.append("r", "", T0, "a", {})
            tx.append("r", "", T0, "a", {})

    def later():
        first_seen.wait(5)
        with store.tx(observer) as tx:
            tx.append("r", "", T0, "b", {})

    threads = [threading.Thread(target=earlier), threading.Thread(target=later)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [1, 3, 2]


def test_an_at_that_its_offset_takes_out_of_range_is_one_sentence_and_writes_nothing(store):
    at = datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1)))
    with store.tx() as tx:
        with pytest.raises(ValueError, match=r"^agentrt: append: at 0001-01-01T00:30:00\+01:00 "
                                             r"is out of range in UTC"):
            tx.append("r", "", at, "t", {})
        tx.append("r", "", T0, "after", {})
    assert [e.type for e in store.list_events("r")] == ["after"]


def test_an_event_of_a_run_that_does_not_exist_is_one_sentence_and_writes_nothing(store):
    seen: list = []
    with store.tx(seen.append) as tx:
        with pytest.raises(ValueError, match=r"^agentrt: append: run 'nope' does not exist"):
            tx.append("nope", "", T0, "t", {})
        tx.append("r", "", T0, "after", {})
    assert [e.seq for e in seen] == [1]
    assert [e.type for e in store.list_events("r")] == ["after"]
    assert store.verify_events().intact
    with store.tx() as tx, pytest.raises(ValueError, match="does not exist"):
        tx.append("nope", "", datetime.now(UTC), "t", b"{}")


@pytest.mark.parametrize("method", ["execute", "run", "one", "only"])
def test_none_for_parameters_still_means_none_to_bind(store, method):
    with store.tx() as tx:
        getattr(tx, method)("CREATE TABLE IF NOT EXISTS t (n); INSERT INTO t VALUES (1)", None)
    assert store.db().execute("SELECT count(*) FROM t").fetchall() == [(1,)]


def test_transaction_control_written_after_a_comment_is_still_refused(store):
    """Only a word at a statement's start was looked at: after a comment, a
    ROLLBACK let the next append commit on its own, chained from a rolled-back
    event, and a savepoint rolled back over an event let the observer be told
    of it (review of 905ad5f)."""
    seen: list = []
    with pytest.raises(TransactionEndedError), store.tx(seen.append) as tx:
        tx.append("r", "", T0, "one", {})
        tx.execute("/* undo */ ROLLBACK")
        tx.append("r", "", T0, "two", {})
    with pytest.raises(TransactionEndedError), store.tx(seen.append) as tx:
        tx.execute("-- keep a mark\nSAVEPOINT sp")
        tx.append("r", "", T0, "one", {})
        tx.execute("/* b */ ROLLBACK TO sp")
    assert seen == [] == store.list_events("r")
    assert store.verify_events().intact


def test_a_trigger_that_ends_the_transaction_refuses_the_next_append(store):
    store.db().execute("CREATE TABLE g (n); CREATE TRIGGER gt BEFORE INSERT ON g "
                       "BEGIN SELECT RAISE(ROLLBACK, 'no'); END")
    with pytest.raises(TransactionEndedError), store.tx() as tx:
        tx.append("r", "", T0, "one", {})
        with pytest.raises(apsw.ConstraintError):
            tx.run("INSERT INTO g VALUES (1)")
        tx.append("r", "", T0, "two", {})
    assert store.list_events("r") == [] and store.verify_events().intact


def test_a_commit_run_after_a_row_is_read_is_refused_at_the_end(store):
    """``execute`` returns at the first row; the COMMIT after it runs as the
    rows are read, after the check made when it returned."""
    seen: list = []
    with pytest.raises(TransactionEndedError), store.tx(seen.append) as tx:
        tx.append("r", "", T0, "one", {})
        list(tx.execute("SELECT 1; COMMIT"))
    assert seen == [] and not store.db().in_transaction


def test_the_sql_shape_check_takes_linear_time_over_long_runs_of_space_and_comments():
    """A nested quantifier over whitespace backtracked exponentially: a long run
    of spaces after a ';' never finished (review of 3f8c897). In a child, so a
    regression fails on the timeout instead of hanging the suite."""
    code = ("from agentrt.store.tx import _shape\n"
            "for sql in (';' + ' ' * 100000 + 'x', (' /* c */ -- d\\n') * 20000 + 'x',\n"
            "            (';' + ' ' * 500) * 500 + 'x', '/*' * 20000 + 'x'):\n"
            "    _shape(sql)\n"
            "print('done')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.stdout.strip() == "done", done.stderr[-300:]
