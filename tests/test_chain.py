"""The event hash chain: verify_events finds the first altered, deleted or swapped event."""

from __future__ import annotations

from datetime import timedelta

import pytest
from store_helpers import T0, file_state, insert_run

from agentrt import chain_hash, open_existing, open_store

MISMATCH = ("the stored hash is not the one the event's fields and the previous event's "
            "hash give")


@pytest.fixture
def path(tmp_path):
    """Three runs whose ten events interleave: seq 1..10 across runs."""
    path = str(tmp_path / "chain.db")
    with open_store(path) as store:
        with store.tx() as tx:
            for r in ("a", "b", "c"):
                insert_run(tx, r)
        for i in range(10):
            with store.tx() as tx:
                tx.append("abc"[i % 3], f"s{i}" if i % 2 else "",
                          T0 + timedelta(milliseconds=i), "step.started", {"i": i})
    return path


def edit(path: str, sql: str, *params: object) -> None:
    with open_store(path) as store:
        store.db().execute(sql, params)


def test_event_hash_golden():
    got = chain_hash("", 1, "r", "", "2026-10-01T09:00:00Z", "run.started", "{}")
    assert got == "215d2d4feca5e8542594838002508a9d6739ae568ac25b15fa28058b3943b60f"


def test_intact_chain_across_runs_verifies(path):
    with open_existing(path) as store:
        report = store.verify_events()
        assert report.intact and report.broken is None
        assert (report.from_seq, report.to_seq, report.checked) == (1, 10, 10)
        assert report.hash == store.event_hash(10) == store.chain_head()[1]
        part = store.verify_events(4, 7)
        assert (part.from_seq, part.to_seq, part.checked, part.intact) == (4, 7, 4, True)
        assert part.hash == store.event_hash(7)


def test_empty_log_verifies_with_nothing_checked(tmp_path):
    with open_store(str(tmp_path / "e.db")) as store:
        report = store.verify_events()
        assert report.intact and report.checked == 0 and report.hash == ""
        assert store.chain_head() == (0, "")


def test_finds_an_altered_payload(path):
    edit(path, "UPDATE events SET payload_json = '{\"i\":99}' WHERE seq = 6")
    with open_existing(path) as store:
        report = store.verify_events()
        assert report.broken is not None
        assert (report.broken.seq, report.checked) == (6, 5)
        assert report.broken.detail == MISMATCH
        assert report.broken.found == store.event_hash(6)
        assert report.broken.expected != report.broken.found
        assert report.hash == store.event_hash(5)


@pytest.mark.parametrize(("column", "value"), [
    ("run_id", "'a'"), ("step_id", "'s9'"), ("at", "at || 'x'"), ("type", "'step.failed'")])
def test_finds_any_altered_field(path, column, value):
    edit(path, f"UPDATE events SET {column} = {value} WHERE seq = 3")
    with open_existing(path) as store:
        broken = store.verify_events().broken
        assert broken is not None and broken.seq == 3


def test_finds_an_altered_hash(path):
    edit(path, "UPDATE events SET hash = ? WHERE seq = 8", "0" * 64)
    with open_existing(path) as store:
        broken = store.verify_events().broken
        assert broken is not None and (broken.seq, broken.found) == (8, "0" * 64)


def test_finds_a_deleted_event(path):
    edit(path, "DELETE FROM events WHERE seq = 4")
    with open_existing(path) as store:
        report = store.verify_events()
        assert report.broken is not None
        assert (report.broken.seq, report.checked) == (5, 3)
        assert report.broken.detail == "seq 5 follows 3: an event is missing"


def test_finds_swapped_events(path):
    edit(path, "UPDATE events SET payload_json = CASE seq WHEN 3 THEN '{\"i\":6}' "
               "ELSE '{\"i\":2}' END, run_id = CASE seq WHEN 3 THEN 'a' ELSE 'c' END "
               "WHERE seq IN (3, 7)")
    with open_existing(path) as store:
        broken = store.verify_events().broken
        assert broken is not None and broken.seq == 3 and broken.detail == MISMATCH


def test_finds_an_altered_first_event(path):
    edit(path, "UPDATE events SET type = 'run.created' WHERE seq = 1")
    with open_existing(path) as store:
        report = store.verify_events()
        assert report.broken is not None and report.broken.seq == 1 and report.checked == 0


def test_finds_a_deleted_first_event(path):
    edit(path, "DELETE FROM events WHERE seq = 1")
    with open_existing(path) as store:
        report = store.verify_events()
        assert report.broken is not None
        assert report.broken.seq == 2
        assert report.broken.detail == "the first event is seq 2: an event is missing"
        # Walking from a later event trusts the stored hash before it.
        assert store.verify_events(3).intact


def test_a_chain_cut_at_the_end_still_verifies_only_a_kept_head_shows_it(path):
    with open_existing(path) as store:
        kept_seq, kept_hash = store.chain_head()
    edit(path, "DELETE FROM events WHERE seq > 7")
    with open_existing(path) as store:
        assert store.verify_events().intact  # nothing inside the chain is wrong
        assert store.chain_head() != (kept_seq, kept_hash)
        assert store.verify_events().hash != kept_hash


def test_verify_writes_nothing(path):
    before = file_state(path)
    with open_existing(path) as store:
        store.verify_events()
    with open_existing(path, read_only=False) as store:
        store.verify_events()
    assert file_state(path) == before


def long_field_db(path: str, payload_chars: int) -> None:
    payload = ('{"content":"' + "ü" * payload_chars + '"}').encode()
    with open_store(path) as store, store.tx() as tx:
        insert_run(tx, "r")
        tx.append("r", "s" * 10_000, T0, "step.tool_finished", payload)
        tx.append("r", "", T0, "run.finished", {})


def statements_of_verify(path: str) -> list[str]:
    seen: list[str] = []

    def trace(cursor, sql, bindings):
        seen.append(sql)
        return True

    with open_existing(path) as store:
        store.db().exec_trace = trace
        report = store.verify_events()
        assert report.intact and report.checked == 2
    return seen


def test_long_fields_are_hashed_in_one_pass_with_no_query_per_chunk(tmp_path):
    """Fields over 4096 bytes are streamed into the hash from one blob handle: a
    query per 64 KiB chunk re-read the value from its start each time, so a
    100 MB payload took hours."""
    short, long_ = str(tmp_path / "short.db"), str(tmp_path / "long.db")
    long_field_db(short, 3_000)  # 6 KB: past the inline 4096 bytes, one chunk
    long_field_db(long_, 1_000_000)  # 2 MB: 31 chunks
    assert statements_of_verify(long_) == statements_of_verify(short)
    payload = ('{"content":"' + "ü" * 1_000_000 + '"}').encode()
    with open_existing(long_) as store:
        assert store.event_hash(1) == chain_hash(
            "", 1, "r", "s" * 10_000, "2026-10-01T09:00:00Z", "step.tool_finished", payload)


@pytest.mark.parametrize("offset", [4095, 4096, 4097, 65536 + 4096, 2_000_013])
def test_a_byte_changed_anywhere_in_a_long_field_breaks_the_chain(tmp_path, offset):
    path = str(tmp_path / "long.db")
    long_field_db(path, 1_000_000)  # 2,000,015 bytes
    edit(path, "UPDATE events SET payload_json = CAST(substr(CAST(payload_json AS BLOB), 1, ?) "
               "|| X'41' || substr(CAST(payload_json AS BLOB), ?) AS TEXT) WHERE seq = 1",
         offset, offset + 2)
    with open_existing(path) as store:
        broken = store.verify_events().broken
        assert broken is not None and broken.seq == 1


def test_the_stored_hash_read_is_cut_to_128_characters(path):
    edit(path, "UPDATE events SET hash = ? WHERE seq = 2", "f" * 1000)
    with open_existing(path) as store:
        assert store.event_hash(2) == "f" * 128
        broken = store.verify_events().broken
        assert broken is not None and broken.found == "f" * 128


@pytest.mark.parametrize(
    ("run_id", "step_id", "payload"),
    [
        ("r", "", b"{}"),
        ("rün", "stép", '{"a":"é"}'),                      # non-ASCII: byte lengths
        ("r" * 1500, "s", b"{}"),                          # a field past the length table
        ("r", "s", b'{"a":"' + b"x" * 5000 + b'"}'),       # a long payload
    ],
)
def test_event_hash_is_sha256_of_seven_netstrings_of_the_stored_bytes(run_id, step_id, payload):
    import hashlib

    def ns(b: bytes) -> bytes:
        return b"%d:%b," % (len(b), b)

    data = payload.encode() if isinstance(payload, str) else payload
    want = hashlib.sha256(b"".join(ns(f) for f in (
        b"a" * 64, b"12345", run_id.encode(), step_id.encode(), b"2026-10-01T09:00:00Z",
        b"step.started", data))).hexdigest()
    assert chain_hash("a" * 64, 12345, run_id, step_id, "2026-10-01T09:00:00Z",
                      "step.started", payload) == want


def test_a_stored_hash_that_is_not_utf8_is_a_break_shown_with_replacement_characters(path):
    edit(path, "UPDATE events SET hash = CAST(X'66FF' AS TEXT) WHERE seq = 3")
    with open_existing(path) as store:
        broken = store.verify_events().broken
        assert broken is not None and (broken.seq, broken.found) == (3, "f\ufffd")
        assert broken.detail == MISMATCH
        broken = store.verify_events(4).broken  # the next event chains from other bytes
        assert broken is not None and broken.seq == 4


def test_an_event_appended_after_a_head_hash_that_is_not_utf8_chains_from_its_bytes(path):
    import hashlib

    edit(path, "UPDATE events SET hash = CAST(X'66FF' AS TEXT) WHERE seq = 10")
    with open_store(path) as store:
        with store.tx() as tx:
            event = tx.append("a", "", T0, "step.started", b"{}")
        want = hashlib.sha256(b"2:f\xff,2:11,1:a,0:,20:2026-10-01T09:00:00Z,"
                              b"12:step.started,2:{},").hexdigest()
        assert store.event_hash(11) == want
        assert event.seq == 11
        assert store.verify_events(11).intact


@pytest.mark.parametrize("seq", [2, 10])
def test_a_correct_hash_stored_as_a_blob_verifies_and_is_chained_from(path, seq):
    edit(path, "UPDATE events SET hash = CAST(hash AS BLOB) WHERE seq = ?", seq)
    with open_store(path) as store:
        assert store.verify_events().intact
        assert store.verify_events(seq + 1).intact
        with store.tx() as tx:
            tx.append("a", "", T0, "step.started", {})
        assert store.verify_events().intact
