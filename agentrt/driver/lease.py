"""The run lease: which driver may write a RUNNING run, kept alive by a heartbeat.

A lease is taken in the transaction that moves a run to RUNNING and cleared in
the one that pauses or ends it. While a session runs, a background thread
renews it every TTL/3 on the store's lease connection (its own connection for a
file, so a consumer holding the main one cannot starve it). Expiry is judged by
the wall clock, never by the driver's configurable clock, because it is
compared across processes.
"""

from __future__ import annotations

import functools
import secrets
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import apsw

from agentrt.errors import LeaseLostError, RunLeasedError
from agentrt.records import Run, RunStatus
from agentrt.store import Store
from agentrt.store.writes import release_lease, renew_lease

__all__ = ["Lease", "WallClock", "lease_owner_id", "lost_to_another", "wall_now"]

WallClock = Callable[[], datetime]


#: The wall clock, ``datetime.now(UTC)``, as a partial (no Python frame per reading).
wall_now: Callable[[], datetime] = functools.partial(datetime.now, UTC)


def lost_to_another(run: Run, owner: str) -> LeaseLostError | None:
    """The error for a run ``owner`` no longer holds because another owner holds it
    now: LeaseLostError naming that owner, caused by its RunLeasedError (spec 10),
    as a write that found it says. None when no other owner holds ``run``."""
    if run.status != RunStatus.RUNNING or not run.lease_owner or run.lease_owner == owner:
        return None
    leased = RunLeasedError(run.id, run.lease_owner, run.lease_expires_at)
    lost = LeaseLostError(leased.detail)
    lost.__cause__ = leased
    return lost


def lease_owner_id(name: str, token: str = "") -> str:
    """A fresh owner id; with a name, ``<name>/<12 hex>`` so two drivers sharing a
    name are still two owners.

    ``token`` replaces the random part (``<name>/<token>``, or the token alone
    without a name): only for a reproducible record, because two drivers given
    the same name and token are one owner.
    """
    if not token:
        token = secrets.token_hex(16)
        return f"{name}/{token[:12]}" if name else token
    return f"{name}/{token}" if name else token


class Lease:
    """One session's hold on one run, and its heartbeat thread."""

    def __init__(
        self, store: Store, run_id: str, owner: str, ttl: timedelta, wall: WallClock
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.owner = owner
        self.ttl = ttl
        self.wall = wall
        self._lock = threading.Lock()
        self._expires: datetime | None = None
        self._lost = False
        #: The driver's clock failing in the heartbeat: raised by the next ``ok``.
        self._clock_failed: Exception | None = None
        self._taken = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def expires_at(self) -> datetime | None:
        return self._expires

    @property
    def lost(self) -> bool:
        return self._lost

    def ok(self) -> bool:
        """Still ours and, by the wall clock, not expired."""
        # acquire and release rather than ``with``: half the cost, once a step.
        self._lock.acquire()
        try:
            if self._clock_failed is not None:
                raise self._clock_failed
            return (not self._lost and self._expires is not None
                    and self.wall() < self._expires)
        finally:
            self._lock.release()

    def start(self, at: datetime) -> None:
        """Note a lease just written (``at`` = the wall reading taken before the write)
        and keep it alive until :meth:`stop`."""
        with self._lock:
            self._expires = at + self.ttl
            self._lost = False
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._beat, name=f"agentrt-lease-{self.run_id}", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        interval = max(self.ttl.total_seconds() / 3, 0.001)
        while not self._stop.wait(interval):
            try:
                expires = self.wall() + self.ttl
            except Exception as exc:  # noqa: BLE001 - the loop says it: see ok()
                with self._lock:
                    self._clock_failed = exc
                return
            try:
                with self.store.lease_connection(wait=interval) as conn:
                    if conn is not self.store.db():  # its own connection: wait TTL/3 at most
                        conn.set_busy_timeout(max(int(interval * 1000), 1))
                    held = renew_lease(conn, self.run_id, self.owner, expires)
            except apsw.Error:
                continue  # busy or closed: try again at the next tick
            with self._lock:
                if not held:
                    self._lost = True
                    return
                self._expires = expires

    def stop(self) -> None:
        """Stop the heartbeat and wait for it; safe to call twice."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._thread = None

    def taking(self) -> None:
        """Note that a write giving this owner the lease is about to commit: from
        here on :meth:`release` may have something to free."""
        self._taken = True

    def release(self) -> None:
        """Free the run for the next Resume at once, if this owner still holds it."""
        if not self._taken:
            return  # this call never wrote the lease (a refused resume): nothing to free
        try:
            with self.store.lease_connection() as conn:
                release_lease(conn, self.run_id, self.owner)
        except apsw.Error:
            pass  # it expires on its own; the next Resume takes it over
