"""Re-checking the event hash chain, with what an operator kept to catch a cut tail.

The chain proves every stored event follows from the one before it, but a
database cut at the end still verifies: nothing after the cut is left to
disagree. A head the operator kept earlier (``SEQ:HASH``, from a previous
check or from a follower) closes that gap: it must still be there, with the
same hash.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrt.errors import NotFoundError, described
from agentrt.store import Store, VerifyReport
from agentrt.view.errors import require_store

__all__ = ["ChainCheck", "KeptHead", "check_chain"]


@dataclass(frozen=True, slots=True)
class KeptHead:
    """A head kept earlier, and what the database holds at its seq now."""

    seq: int
    hash: str
    #: The stored hash at ``seq`` now, '' when there is no such event.
    found: str
    matches: bool
    #: Whether an event with this seq is stored at all (its hash may be blank).
    present: bool = False


@dataclass(frozen=True, slots=True)
class ChainCheck:
    """The head when the check began, the walk, and the promises it was held to."""

    head_seq: int
    head_hash: str
    report: VerifyReport
    #: The seq of the last event checked, 0 when none was.
    last_seq: int
    #: The --to asked for (0: the head), and whether the walk got that far.
    requested_to: int
    reached: bool
    kept: KeptHead | None

    @property
    def problems(self) -> list[str]:
        """One sentence per failed promise; empty when the check passed."""
        out: list[str] = []
        broken = self.report.broken
        if broken is not None:
            out.append(f"the event chain is broken at seq {broken.seq}: {broken.detail}")
        if self.requested_to and not self.reached and broken is None:
            out.append(
                f"the event chain is shorter than asked: --to {self.requested_to} was not "
                f"reached; the last event checked is seq {self.last_seq}")
        kept = self.kept
        if kept is not None and not kept.matches:
            if not kept.present and self.head_seq == 0:
                why = f"seq {kept.seq} is not in the database, which holds no events"
            elif not kept.present and kept.seq > self.head_seq:
                why = (f"seq {kept.seq} is not in the database; the newest event is seq "
                       f"{self.head_seq}, so events were removed from the end")
            elif not kept.present:
                why = (f"seq {kept.seq} is not in the database, though the newest event is "
                       f"seq {self.head_seq}: it was removed")
            else:
                why = (f"seq {kept.seq} has hash {kept.found or '(none stored)'}, "
                       f"not the kept {kept.hash}")
            out.append(f"the event chain does not match the head kept: {why}")
        return out


def _last_seq(store: Store, report: VerifyReport) -> int:
    """The seq of the last event the walk checked. The walk checks consecutive
    seqs (a gap is a break) from the first event at or after its start, so the
    last is counted from that first one; looking it up below ``--to`` instead
    would find events a consumer committed after the walk, never checked."""
    if report.checked == 0:
        return 0
    with store.locked() as conn:
        row = conn.execute("SELECT MIN(seq) FROM events WHERE seq >= ?",
                           (report.from_seq,)).fetchone()
    return int(row[0]) + report.checked - 1 if row is not None and row[0] is not None else 0


def check_chain(store: Store, from_seq: int = 0, to_seq: int = 0,
                kept: tuple[int, str] | None = None) -> ChainCheck:
    """Read the head, walk the chain from ``from_seq`` to ``to_seq`` (0: the head),
    and hold it to the kept head when one is given. Writes nothing."""
    require_store(store)
    if kept is not None and not (isinstance(kept, tuple) and len(kept) == 2
                                 and isinstance(kept[0], int) and isinstance(kept[1], str)):
        raise TypeError(f"agentrt: kept is {described(kept)}, not a (seq, hash) pair: pass "
                        "the seq and hash a check printed, such as (31, '210c5f...')")
    head_seq, head_hash = store.chain_head()
    report = store.verify_events(from_seq, to_seq)
    last = _last_seq(store, report) if report.broken is None else 0
    kept_head: KeptHead | None = None
    if kept is not None:
        seq, want = kept
        try:
            found, present = store.event_hash(seq), True
        except NotFoundError:
            found, present = "", False
        kept_head = KeptHead(seq, want, found, bool(found) and found == want, present)
    return ChainCheck(
        head_seq=head_seq,
        head_hash=head_hash,
        report=report,
        last_seq=last,
        requested_to=to_seq,
        reached=to_seq <= 0 or last >= to_seq,
        kept=kept_head,
    )
