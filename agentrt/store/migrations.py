"""Forward-only schema migrations.

A released migration is never edited (``test_released_migrations_are_unchanged``
pins their text). All missing migrations run in ONE immediate transaction that
first reads the current version, so two processes opening a new file at once
are safe: the second waits, then finds the work done.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import apsw

from agentrt.errors import SchemaVersionError
from agentrt.records import DEFAULT_LEASE_TTL, PRE_LEASE_OWNER
from agentrt.store.chainread import backfill_hashes
from agentrt.timefmt import format_time

__all__ = ["MIGRATIONS", "current_version", "migrate", "migration_clash", "refuse_newer",
           "rehearse", "unknown_version"]

_M1 = """
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    goal TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    reason_detail TEXT NOT NULL DEFAULT '',
    limits_json TEXT NOT NULL,
    step_count INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    started_at TEXT NOT NULL DEFAULT '',
    finished_at TEXT NOT NULL DEFAULT '',
    result_json TEXT NOT NULL DEFAULT ''
);
CREATE TABLE steps (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id),
    idx INTEGER NOT NULL,
    status TEXT NOT NULL,
    decision_json TEXT NOT NULL DEFAULT '',
    policy_json TEXT NOT NULL DEFAULT '',
    observation_json TEXT NOT NULL DEFAULT '',
    observation_hash TEXT NOT NULL DEFAULT '',
    started_at TEXT NOT NULL,
    finished_at TEXT NOT NULL DEFAULT '',
    UNIQUE (run_id, idx)
);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(id),
    step_id TEXT NOT NULL DEFAULT '',
    at TEXT NOT NULL,
    type TEXT NOT NULL,
    payload_json TEXT NOT NULL
);
CREATE INDEX events_run ON events(run_id, seq);
"""

_M2 = """
CREATE TABLE approvals (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id),
    step_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    capability_json TEXT NOT NULL,
    presentation_json TEXT NOT NULL,
    request_json TEXT NOT NULL,
    hash TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    decided_at TEXT NOT NULL DEFAULT '',
    decided_by TEXT NOT NULL DEFAULT '',
    note TEXT NOT NULL DEFAULT ''
);
CREATE INDEX approvals_run ON approvals(run_id, created_at);
"""

_M3 = """
CREATE TABLE model_calls (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id),
    step_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    status TEXT NOT NULL,
    model TEXT NOT NULL,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cached_input_tokens INTEGER NOT NULL DEFAULT 0,
    cost_micros INTEGER NOT NULL DEFAULT 0,
    latency_ms INTEGER NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '',
    dispatched_at TEXT NOT NULL,
    completed_at TEXT NOT NULL DEFAULT ''
);
CREATE INDEX model_calls_run ON model_calls(run_id, dispatched_at);
ALTER TABLE runs ADD COLUMN model_calls INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cached_input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN estimated_cost_micros INTEGER NOT NULL DEFAULT 0;
"""

_M4 = """
ALTER TABLE runs ADD COLUMN active_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE approvals ADD COLUMN expires_at TEXT NOT NULL DEFAULT '';
"""

_M5 = """
ALTER TABLE runs ADD COLUMN lease_owner TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN lease_expires_at TEXT NOT NULL DEFAULT '';
"""

_M6 = """
CREATE TABLE tool_specs (
    hash TEXT PRIMARY KEY,
    spec_json TEXT NOT NULL
);
ALTER TABLE steps ADD COLUMN spec_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE steps ADD COLUMN policy_id TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN hash TEXT NOT NULL DEFAULT '';
"""

#: The released migrations, in order; version N is ``MIGRATIONS[N-1]``.
MIGRATIONS: tuple[str, ...] = (_M1, _M2, _M3, _M4, _M5, _M6)


def _lease_placeholders(conn: apsw.Connection) -> None:
    """Migration 5's side action: a run a pre-lease process may still be
    executing gets one lease of grace under the placeholder owner."""
    expires = format_time(datetime.now(UTC) + DEFAULT_LEASE_TTL)
    conn.execute(
        "UPDATE runs SET lease_owner = ?, lease_expires_at = ? WHERE status = 'RUNNING'",
        (PRE_LEASE_OWNER, expires),
    )


_SIDE_ACTIONS = {5: _lease_placeholders, 6: backfill_hashes}


def current_version(conn: apsw.Connection) -> int:
    """The highest applied migration; raises apsw.SQLError without schema_migrations."""
    row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
    value = row[0] if row else 0
    if not isinstance(value, int):
        raise apsw.SQLError(f"schema_migrations.version holds {str(value)[:40]!r}, not an integer")
    return value


def unknown_version(path: str, version: int) -> SchemaVersionError:
    """The refusal of a version no build writes (below 0): neither older nor newer,
    so neither migrating it nor another build's open is the fix."""
    return SchemaVersionError(
        f"{path} is at version {version}, which no agentrt build writes: it is not a "
        "database an agentrt consumer made; name the file one made",
        found=version,
        known=len(MIGRATIONS),
    )


def _refuse_newer(version: int, path: str) -> None:
    known = len(MIGRATIONS)
    if version < 0:
        raise unknown_version(path, version)
    if version > known:
        raise SchemaVersionError(
            f"{path}: the database is at version {version}, this build knows {known}; "
            f"open it with the agentrt build that migrated it to version {version}",
            found=version,
            known=known,
        )


_CREATES = re.compile(r"CREATE (?:TABLE|INDEX) (\w+)")
_ADDS = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+)")


def migration_clash(conn: apsw.Connection, version: int) -> str | None:
    """What of a database at ``version`` the missing migrations could not make,
    said as "holds ..." (None when nothing): a name one creates that another
    program took, a column one adds that is there already, a table one alters
    that is missing. Read before anything is written, so such a file is refused
    as it was instead of failing inside the migration, switched to WAL."""
    taken = {str(name).lower(): str(kind) for kind, name in conn.execute(
        "SELECT lower(type), name FROM sqlite_schema WHERE name IS NOT NULL")}
    made: set[str] = set()
    for text in MIGRATIONS[max(version, 0):]:
        for name in _CREATES.findall(text):
            if name.lower() in taken:
                kind = taken[name.lower()]
                article = "an" if kind[:1] in ("a", "e", "i", "o", "u") else "a"
                return f"holds {article} {kind} named {name}, which agentrt creates"
            made.add(name.lower())
        for table, column in _ADDS.findall(text):
            if table.lower() in made:
                continue
            if table.lower() not in taken:
                return f"has no table {table}, which agentrt's migrations add a column to"
            columns = {str(r[1]).lower() for r in conn.execute(f"PRAGMA table_info({table})")}
            if column.lower() in columns:
                return f"has a column {column} in its table {table}, which agentrt adds"
    return None


def rehearse(conn: apsw.Connection, version: int) -> str | None:
    """SQLite's words for what stops the missing migrations of ``conn``'s
    database, at ``version``, found by running them, side steps included, on
    an empty in-memory copy of its schema (None when they would run).

    What :func:`migration_clash` does not name fails here instead of inside
    the real migration, after the switch to WAL: another program's table
    called ``schema_migrations``, a column a side step reads that another
    program dropped. A virtual table of a module this SQLite lacks, or an
    index on a collation or function it lacks, is left out of the copy; a
    table that cannot be copied leaves the schema unjudged."""
    schema = [(str(kind), str(name), str(sql)) for kind, name, sql in conn.execute(
        "SELECT lower(type), name, sql FROM sqlite_schema WHERE sql IS NOT NULL "
        "AND name NOT LIKE 'sqlite!_%' ESCAPE '!' ORDER BY rowid")]
    if not schema:
        return None  # a new file: nothing there to stop them
    copy = apsw.Connection(":memory:")
    try:
        for kind, name, sql in schema:
            # A virtual table (FTS5, R*Tree) makes its shadow tables itself.
            if copy.execute("SELECT 1 FROM sqlite_schema WHERE name = ?", (name,)).fetchall():
                continue
            try:
                copy.execute(sql)
            except apsw.Error:
                if kind == "index" or sql.lstrip()[:21].upper() == "CREATE VIRTUAL TABLE ":
                    # A module, collation or function this SQLite lacks: no migration
                    # touches such an object (its name was checked by migration_clash).
                    continue
                return None
        try:
            if version > 0:
                copy.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, '')",
                             (version,))
            migrate(copy, ":memory:")
        except apsw.Error as exc:  # a constraint of another program's table, too
            return re.sub(r"^\w+Error: ", "", str(exc))
        return None
    finally:
        copy.close()


def refuse_newer(conn: apsw.Connection, path: str) -> int:
    """Refuse, before anything is written, a database a newer build migrated;
    return its version (0 for a file with no migrations yet).

    :func:`migrate` checks again inside its transaction; this earlier check
    keeps the refusal from switching the file to WAL first.
    """
    row = conn.execute(
        # SQLite's names ignore case: a "Schema_Migrations" is the table every
        # statement reads, and missing it would skip the checks made before writing.
        "SELECT 1 FROM sqlite_schema WHERE lower(type) = 'table' "
        "AND lower(name) = 'schema_migrations'"
    ).fetchone()
    if row is None:
        return 0
    version = current_version(conn)
    _refuse_newer(version, path)
    return version


def migrate(conn: apsw.Connection, path: str) -> None:
    """Apply every missing migration in one IMMEDIATE transaction.

    The transaction reads the version first, so of two processes opening a
    new file at once the second waits for the first and finds the work done.
    Raises SchemaVersionError, changing nothing, for a database a newer build
    migrated.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
        version = current_version(conn)
        _refuse_newer(version, path)
        for number in range(version + 1, len(MIGRATIONS) + 1):
            conn.execute(MIGRATIONS[number - 1])
            side = _SIDE_ACTIONS.get(number)
            if side is not None:
                side(conn)
            conn.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)",
                (number, format_time(datetime.now(UTC))),
            )
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
