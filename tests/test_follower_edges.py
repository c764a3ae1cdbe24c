"""The Follower at the edges of its API: a page sink's unusable PartialPage
count, a stop set before follow(), head() of a missing event, a huge interval."""

from __future__ import annotations

import threading

import pytest
from eventdb import make_db

from agentrt.errors import NotFoundError
from agentrt.store import open_existing
from agentrt_export import Follower, FollowError, MemoryCursor, PartialPage
from agentrt_export.follower import MAX_INTERVAL


class CountingCursor(MemoryCursor):
    """A memory cursor that counts its saves."""

    def __init__(self, seq: int = 0) -> None:
        super().__init__(seq)
        self.saves = 0

    def save(self, seq: int) -> None:
        self.saves += 1
        super().save(seq)


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "runs.db")
    make_db(path, runs=1, events_per_run=8).close()
    return path


@pytest.mark.parametrize("accepted", [-1, 9, 20, True, 1.0, "2", None, 10**5000],
                         ids=lambda a: "huge" if a == 10**5000 else repr(a))
def test_a_partial_page_with_an_unusable_count_raises_the_sinks_error_and_saves_nothing(
        db, accepted):
    failure = OSError(28, "No space left on device")

    class Sink:
        def handle_page(self, events):
            raise PartialPage(accepted, failure)

    cursor = CountingCursor()
    with pytest.raises(OSError) as raised:
        Follower(open_existing(db), cursor=cursor, once=True).follow(Sink())
    assert raised.value is failure
    assert any("PartialPage" in note and "unusable" in note
               for note in getattr(raised.value, "__notes__", []))
    assert (cursor.load(), cursor.saves) == (0, 0)


@pytest.mark.parametrize("accepted", [0, 3, 8])
def test_a_partial_page_with_a_count_from_0_to_the_whole_page_saves_after_that_many(
        db, accepted):
    failure = OSError(28, "No space left on device")

    class Sink:
        def handle_page(self, events):
            raise PartialPage(accepted, failure)

    cursor = MemoryCursor()
    with pytest.raises(OSError) as raised:
        Follower(open_existing(db), cursor=cursor, once=True).follow(Sink())
    assert raised.value is failure
    assert cursor.load() == accepted


@pytest.mark.parametrize("once", [False, True])
@pytest.mark.parametrize("page_sink", [False, True], ids=["event sink", "page sink"])
def test_a_stop_set_before_follow_delivers_nothing_and_saves_nothing(db, once, page_sink):
    got: list = []

    class Pages:
        def handle_page(self, events):
            got.extend(events)

    stop = threading.Event()
    stop.set()
    cursor = CountingCursor()
    Follower(open_existing(db), cursor=cursor, once=once, page_size=3).follow(
        Pages() if page_sink else got.append, stop)
    assert got == []
    assert (cursor.load(), cursor.saves) == (0, 0)


def test_head_of_a_cursor_whose_event_is_missing_is_a_not_found_error_and_a_follow_error(db):
    follower = Follower(open_existing(db), cursor=MemoryCursor(9))
    with pytest.raises(NotFoundError) as raised:
        follower.head()
    assert isinstance(raised.value, FollowError)
    assert str(raised.value) == "export: head at seq 9: agentrt: not found: event 9"


@pytest.mark.parametrize("interval", [10**400, float("inf"), 1e300],
                         ids=["10**400", "inf", "1e300"])
def test_a_huge_interval_is_cut_to_the_maximum(db, interval):
    assert Follower(open_existing(db), interval=interval).interval == MAX_INTERVAL


def test_a_hugely_negative_interval_is_refused_in_a_sentence(db):
    with pytest.raises(FollowError, match="is negative"):
        Follower(open_existing(db), interval=-10**400)


@pytest.mark.parametrize("setting", ["interval", "page_size"])
def test_a_negative_setting_of_thousands_of_digits_is_refused_in_a_sentence(db, setting):
    """Python refuses to write an int past 4300 digits: the sentence itself
    raised ValueError."""
    with pytest.raises(FollowError, match=r"-\(a number of 16610 bits\) is negative"):
        Follower(open_existing(db), **{setting: -10**5000})
