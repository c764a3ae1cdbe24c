"""Cursors: where a follower remembers the last delivered seq."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from agentrt.errors import AgentrtError
from agentrt_export import Cursor, CursorError, FileCursor, MemoryCursor


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_file_cursor_loads_zero_when_missing_and_refuses_garbage(tmp_path):
    path = tmp_path / "cursor"
    cursor = FileCursor(path)
    assert cursor.load() == 0
    assert not path.exists()

    cursor.save(42)
    assert cursor.load() == 42
    assert path.read_bytes() == b"42\n"
    assert mode(path) == 0o600
    assert os.listdir(tmp_path) == ["cursor"]  # no temp files left

    path.write_text("not a number")
    with pytest.raises(CursorError) as caught:
        cursor.load()
    assert str(caught.value) == (
        f"export: load cursor: {path} does not hold a sequence number; name another cursor "
        "file, or remove it if it is a stale cursor, or restore it from a backup"
    )
    assert isinstance(caught.value, AgentrtError)
    assert caught.value.path == str(path)


@pytest.mark.parametrize(
    "content",
    [b"-1\n", b"+5\n", b"", b"\n", b"4_2\n", "٤٢".encode(), b"0x10", b"1 2", b"9223372036854775808",
     b"7" * 100],
)  # fmt: skip
def test_file_cursor_refuses_what_is_not_a_non_negative_decimal(tmp_path, content):
    path = tmp_path / "cursor"
    path.write_bytes(content)
    with pytest.raises(CursorError, match="does not hold a sequence number"):
        FileCursor(path).load()


def test_file_cursor_trims_whitespace_and_takes_the_largest_seq(tmp_path):
    path = tmp_path / "cursor"
    path.write_bytes(b" 7 \r\n")
    assert FileCursor(path).load() == 7
    path.write_bytes(b"9223372036854775807\n")
    assert FileCursor(path).load() == 2**63 - 1


def test_file_cursor_reports_a_file_it_cannot_read(tmp_path):
    (tmp_path / "cursor").mkdir()
    with pytest.raises(CursorError, match=r"^export: load cursor: cannot read .*cursor"):
        FileCursor(tmp_path / "cursor").load()


@pytest.mark.parametrize("fail", ["replace", "fsync"])
def test_failed_save_leaves_the_old_cursor_intact(tmp_path, monkeypatch, fail):
    path = tmp_path / "cursor"
    cursor = FileCursor(path)
    cursor.save(5)

    def no_space(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, fail, no_space)
    with pytest.raises(CursorError, match=r"^export: save cursor: .*No space left on device"):
        cursor.save(6)
    monkeypatch.undo()
    assert cursor.load() == 5
    assert os.listdir(tmp_path) == ["cursor"]


def test_a_failed_save_names_the_cursor_file_and_the_seq_it_still_holds(tmp_path, monkeypatch):
    gone = tmp_path / "gone" / "cursor"
    with pytest.raises(CursorError) as caught:
        FileCursor(gone).save(1)
    assert str(caught.value) == (
        f"export: save cursor: cannot write {gone}: No such file or directory; no seq was saved "
        "before, so the next start sends every event again")  # no temp file, no previous seq
    path = tmp_path / "cursor"
    cursor = FileCursor(path)
    cursor.save(5)

    def no_space(*args):
        raise OSError(errno.ENOSPC, "No space left on device", "/elsewhere/.cursor.tmp")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(CursorError) as caught:
        cursor.save(6)
    assert str(caught.value) == (
        f"export: save cursor: cannot write {path}: No space left on device; it holds seq 5, "
        "so the next start sends the events after it again")


def test_check_refuses_a_cursor_that_could_not_be_saved_before_anything_is_read(tmp_path):
    db = tmp_path / "runs.db"
    db.write_bytes(b"SQLite format 3\0")
    os.link(db, tmp_path / "linked")
    (tmp_path / "afile").write_text("")
    refused = {
        tmp_path / "gone" / "cursor": "the directory of cursor file {p} does not exist",
        tmp_path / "afile" / "cursor": "cursor file {p} is not in a directory",
        f"{tmp_path}{os.sep}": "cursor file {p} names a directory",
        tmp_path: "cursor file {p} is not a regular file (a directory)",
        os.devnull: "cursor file {p} is not a regular file (a character device)",
        db: "cursor file {p} is the database",
        tmp_path / "linked": "cursor file {p} is the database",
        tmp_path / "." / "runs.db-wal": "cursor file {p} is the write-ahead log of the database",
    }
    for path, start in refused.items():
        with pytest.raises(CursorError) as caught:
            FileCursor(path).check(database=str(db))
        assert str(caught.value).startswith("export: " + start.format(p=path)), path
    FileCursor(tmp_path / "cursor").check(database=str(db))  # not there yet: fine
    (tmp_path / "cursor").write_text("garbage")  # load says what is wrong with it
    FileCursor(tmp_path / "cursor").check(database=str(db))
    FileCursor(db).check()  # no database to compare with
    assert sorted(os.listdir(tmp_path)) == ["afile", "cursor", "linked", "runs.db"]


def test_save_into_a_missing_directory_is_a_cursor_error(tmp_path):
    with pytest.raises(CursorError, match="save cursor"):
        FileCursor(tmp_path / "gone" / "cursor").save(1)


def test_file_cursor_is_0600_whatever_the_umask_or_the_old_mode(tmp_path):
    path = tmp_path / "cursor"
    path.write_bytes(b"1\n")
    path.chmod(0o644)
    old = os.umask(0o277)
    try:
        FileCursor(path).save(2)
    finally:
        os.umask(old)
    assert mode(path) == 0o600
    assert FileCursor(path).load() == 2


def test_file_cursor_syncs_the_file_then_renames_it_then_syncs_its_directory(
        tmp_path, monkeypatch):
    """The order is the guarantee: the data is on disk before the name points
    at it, and the name is on disk after (a directory synced before the
    rename would not keep it across a power cut)."""
    done: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def recording_fsync(fd):
        done.append("sync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "sync file")
        real_fsync(fd)

    def recording_replace(src, dst, *args, **kwargs):
        done.append("rename")
        real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    FileCursor(tmp_path / "cursor").save(3)
    assert done == ["sync file", "rename", "sync dir"]


def test_file_cursor_works_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cursor = FileCursor("cursor")
    cursor.save(8)
    assert cursor.load() == 8
    assert os.listdir(tmp_path) == ["cursor"]


def test_file_cursor_refuses_to_save_a_negative_seq(tmp_path):
    with pytest.raises(ValueError):
        FileCursor(tmp_path / "cursor").save(-1)
    assert not (tmp_path / "cursor").exists()


def test_memory_cursor_holds_the_last_saved_seq():
    cursor = MemoryCursor()
    assert cursor.load() == 0
    cursor.save(12)
    assert cursor.load() == 12 and cursor.seq == 12
    assert MemoryCursor(seq=4).load() == 4


def test_both_cursors_meet_the_cursor_protocol(tmp_path):
    assert isinstance(MemoryCursor(), Cursor)
    assert isinstance(FileCursor(tmp_path / "c"), Cursor)
