"""Page reads cut a value over the cap from the blob handle, never holding it whole.

The cut must read exactly as SQLite's ``capped_text`` / ``capped_json``
expressions did (length() and substr() semantics, json_object's escaping,
invalid UTF-8, NULs, BLOBs, numbers, NULL), from the snapshot the row was read
in, with a peak memory that does not follow the value's size.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import apsw
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from store_helpers import child_env, insert_approval, insert_run, insert_step

from agentrt import MAX_PAGE_TEXT, open_store
from agentrt.store.bigcells import cut
from agentrt.store.pages import (
    CappedColumns,
    capped_json,
    capped_text,
    fetch_capped,
    marked_json,
    marked_text,
)
from agentrt.store.rows import OTHER, TEXT, Columns, fetch

N = MAX_PAGE_TEXT


def _both_ways(values: list[object], n: int, *, as_text: bool) -> tuple[list, list]:
    """(the SQL expressions' rows, fetch_capped's rows) of ``values`` in a scratch table."""
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE t (v)")
    insert = "INSERT INTO t VALUES (CAST(? AS TEXT))" if as_text else "INSERT INTO t VALUES (?)"
    for v in values:
        conn.execute(insert if isinstance(v, bytes) else "INSERT INTO t VALUES (?)", (v,))
    sql = fetch(conn, Columns.of([(capped_text("v", n), TEXT), (capped_json("v", n), OTHER)]),
                "FROM t ORDER BY rowid")
    cols = CappedColumns.of("t", [(marked_text("v", n), TEXT, ("v", False)),
                                  (marked_json("v", n), OTHER, ("v", True))], n=n)
    new = [r[:2] for r in fetch_capped(conn, cols, "FROM t ORDER BY rowid")]
    assert not conn.in_transaction
    return sql, new


#: Bytes that exercise SQLite's character counting: ASCII, NUL, quotes and
#: controls json_object escapes, lead bytes, stray continuation bytes.
_PIECES = [b"a", b"\x00", b'"', b"\\", b"\n", b"\x1f", b"\x7f", b"\xc3\xa9", b"\xe2\x82\xac",
           b"\xf0\x9f\x98\x80", b"\xc3", b"\x80", b"\xbf", b"\xff"]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(_PIECES), max_size=40), n=st.integers(1, 12),
       as_text=st.booleans())
def test_a_cut_cell_reads_as_the_sql_capping_expressions_give_it(pieces, n, as_text):
    value = b"".join(pieces)
    # One deliberate difference: a head of n characters over 4 n bytes (a byte
    # from 0x80 up with more continuation bytes than UTF-8 has) is cut at 4 n.
    conn = apsw.Connection(":memory:")
    head = conn.execute("SELECT octet_length(substr(CAST(? AS TEXT), 1, ?))", (value, n))
    assume(head.fetchone()[0] <= 4 * n)
    sql, new = _both_ways([value], n, as_text=as_text)
    assert new == sql


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(_PIECES), max_size=40), n=st.integers(1, 12),
       ends=st.lists(st.integers(0, 200), max_size=8))
def test_the_cut_is_the_same_wherever_the_chunks_end(pieces, n, ends):
    value = b"".join(pieces)
    bounds = sorted({0, len(value), *(e % (len(value) + 1) for e in ends)})
    chunks = [value[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    conn = apsw.Connection(":memory:")
    (length,) = conn.execute("SELECT length(CAST(? AS TEXT))", (value,)).fetchone()
    assert cut(chunks, n) == cut([value], n)
    assert cut(chunks, n)[1] == length


def test_numbers_null_and_short_values_read_as_the_sql_gives_them():
    # A number's text is at most 24 characters, so it fits any cap from there.
    values = [None, 7, 2.5, -(2**63), 1e308, b"", "short", b"\xff\xfe", b"x" * 25, "é" * 25]
    sql, new = _both_ways(values, 24, as_text=False)
    assert new == sql


@pytest.mark.parametrize("value", [
    "x" * N,  # exactly the cap: fits
    "x" * (N + 1),
    "é" * (N + 1),  # two bytes a character, over the cap in bytes and characters
    "a" * (N - 1) + "€😀" + "b" * 10,  # multi-byte characters across the cut
    "a" * 10 + "\x00" + "b" * (5 * N),  # a NUL before the cut: length() stops there
    "a" * (N + 5) + "\x00" + "b" * 10,  # a NUL after the cut
    '"\\\n' * (N // 2),  # characters json_object escapes
], ids=["exactly-N", "N+1", "two-byte", "across-the-cut", "nul-before", "nul-after",
        "escaped"])
def test_values_at_the_real_cap_read_as_the_sql_gives_them(value):
    sql, new = _both_ways([value.encode(), value.encode() + b"\xff"], N, as_text=True)
    assert new == sql
    sql, new = _both_ways([value.encode()], N, as_text=False)  # as a BLOB
    assert new == sql


def test_every_page_read_hands_out_what_the_sql_capping_gives(tmp_path):
    """The store's reads, fast path and fallback included, against the SQL
    expressions over the same file."""
    text = ("a" * (N - 1) + "€😀\x00" + "b" * N).encode() + b"\xff"
    payload = b'{"x":"' + text + b'"}'
    path = str(tmp_path / "a.db")
    with open_store(path) as store:
        with store.tx() as tx:  # by hand: appends refuse payloads that are not UTF-8
            insert_run(tx, "r")
            tx.execute("UPDATE runs SET goal = CAST(? AS TEXT)", (text,))
            tx.execute("INSERT INTO events (run_id, at, type, payload_json) "
                       "VALUES ('r', '2026-10-01T09:00:00Z', 't', CAST(? AS TEXT))", (payload,))
        conn = store.db()
        want_goal, want_payload = fetch(conn, Columns.of(
            [(capped_text("goal"), TEXT), (capped_json("payload_json"), OTHER)]),
            "FROM runs, events")[0]
        assert store.get_run_capped("r").goal == want_goal
        assert store.list_runs_page(1, 0)[0][0].goal == want_goal
        assert store.list_events_after("", 0, 5)[0].payload == want_payload
        assert store.list_events_after("r", 0, 5)[0].payload == want_payload
        assert store.list_events_page("r", 5, 0)[0][0].payload == want_payload
        assert not conn.in_transaction


def test_a_head_of_endless_continuation_bytes_is_cut_at_four_bytes_a_character():
    """SQLite counts a lead byte and every continuation byte after it as one
    character; its substr() would hand all of them out, the cut at most 4 n."""
    value = b"\xc3" + b"\x80" * 1000 + b"abc"
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE t (v)")
    conn.execute("INSERT INTO t VALUES (CAST(? AS TEXT))", (value,))
    cols = CappedColumns.of("t", [(marked_json("v", 2), OTHER, ("v", True))], n=2)
    (row,) = fetch_capped(conn, cols, "FROM t")
    assert row[0] == b'{"truncated":true,"length":4,"head":"\xc3' + b"\x80" * 7 + b'"}'


def test_an_oversized_cell_is_cut_from_the_snapshot_its_row_was_read_in(tmp_path, monkeypatch):
    """Another process rewrites the value between the row's read and the cut;
    the cut still reads the value the row was read with, and the read
    transaction is over when the page returns."""
    from agentrt.store import pages

    path = str(tmp_path / "a.db")
    with open_store(path) as store:
        with store.tx() as tx:
            insert_run(tx, "r", goal="g" * (N + 10))
        real_cut = pages.read_cut

        def rewrite_then_cut(*args):
            subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
                import apsw
                c = apsw.Connection({path!r})
                c.set_busy_timeout(5000)
                c.execute("UPDATE runs SET goal = ? WHERE id = 'r'", ("h" * {N + 99},))
            """)], check=True, timeout=30)
            return real_cut(*args)

        monkeypatch.setattr(pages, "read_cut", rewrite_then_cut)
        run = store.get_run_capped("r")
        assert run.goal == "g" * N + f"…[truncated: {N + 10} characters]"
        assert not store.db().in_transaction
        monkeypatch.undo()
        assert store.get_run_capped("r").goal.endswith(f"…[truncated: {N + 99} characters]")


_READER = textwrap.dedent("""
    import json, sys
    from agentrt.store import open_existing

    def read_all(path):
        with open_existing(path, read_only=True) as s:
            out = [len(s.list_events_after("", 0, 10)[0].payload),
                   len(s.list_events_page("r", 10, 0)[0][0].payload),
                   len(s.list_runs_page(10, 0)[0][0].goal),
                   len(s.get_run_capped("r").goal),
                   len(s.list_steps_page("r", 10, 0)[0][0].status),
                   len(s.list_approvals_page("r", "", 10, 0)[0][0].capability),
                   len(s.pending_approval_ids_of(["r"], 5)["r"][0])]
        return out, peak_kib()

    def peak_kib():
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the process
        # that started this one (fork, then exec), here pytest with the data.
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

    small, base = read_all(sys.argv[1])
    big, peak = read_all(sys.argv[2])
    print(json.dumps({"small": small, "big": big, "base_kib": base, "peak_kib": peak}))
""")


def _database(path: str, size: int) -> None:
    """A waiting run whose goal, one step's status, its pending approval's id and
    capability and one event's payload are each ``size`` characters, written by a plain
    connection without syncing (the store's own writes sync each commit)."""
    with open_store(path) as store, store.tx() as tx:
        insert_run(tx, "r", status="WAITING_FOR_APPROVAL")
        insert_step(tx, "s0", "r", 0)
        insert_approval(tx, "ap", "r", "s0")
    text = b"x" * size
    payload = b'{"content":"' + text[: size - 14] + b'"}'
    conn = apsw.Connection(path)
    conn.execute("PRAGMA synchronous = OFF")
    with conn:
        conn.execute("UPDATE runs SET goal = CAST(? AS TEXT)", (text,))
        conn.execute("UPDATE steps SET status = CAST(? AS TEXT)", (text,))
        conn.execute("UPDATE approvals SET capability_json = CAST(? AS TEXT), "
                     "id = CAST(? AS TEXT)", (payload, text))
        conn.execute("INSERT INTO events (run_id, step_id, at, type, payload_json) "
                     "VALUES ('r', 's0', '2026-10-01T09:00:00Z', 'step.tool_finished', "
                     "CAST(? AS TEXT))", (payload,))
    conn.close()


def test_reading_pages_of_64_mb_values_costs_a_reader_far_less_than_their_size(tmp_path):
    small, big = str(tmp_path / "small.db"), str(tmp_path / "big.db")
    _database(small, 100)
    _database(big, 64 << 20)
    done = subprocess.run([sys.executable, "-c", _READER, small, big], env=child_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    marker = len(f"…[truncated: {64 << 20} characters]")
    # Every value arrived cut: the JSON columns as the truncation object.
    assert got["big"][2] == got["big"][3] == got["big"][4] == got["big"][6] == N + marker
    assert all(N < size < N + 100 for size in got["big"][:2] + got["big"][5:6])
    grown_mb = (got["peak_kib"] - got["base_kib"]) / 1024
    assert grown_mb < 32, f"peak RSS grew {grown_mb:.0f} MB reading 64 MB values"


def test_reading_the_time_of_events_with_huge_at_cells_keeps_none_of_them():
    """An ``at`` cell arrives capped at 64 Ki characters; reading the time of
    such events parsed them through a 4096-entry cache that kept every text
    (about 1 GB of them in the worst case) for the life of the process."""
    import tracemalloc

    from agentrt.events import event_from_fields
    from agentrt.timefmt import ZERO_TIME
    from agentrt.trace import jsonl_record

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(256):
            at = f"{i:08d}" + "x" * MAX_PAGE_TEXT + "…[truncated: 70000 characters]"
            event = event_from_fields((i + 1, "r", "", at, "t", b"{}"))
            assert event.at == ZERO_TIME
            assert b'"at":"0001-01-01T00:00:00Z"' in jsonl_record(event)
            del at, event
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 2_000_000, f"{kept} bytes kept after reading 256 huge times"
