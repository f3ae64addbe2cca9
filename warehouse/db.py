"""The DuckDB warehouse: one file per project directory, numbered migrations, batched idempotent writes.

DuckDB allows one process to hold the file read-write, and then no other can open it at all. So a `Warehouse`
holds the file only inside `held()` (each read, each batch's transaction) and releases it between: while a
run's stages compute, readers get in, and they see committed batches only. A second writer gets
`WarehouseBusy("warehouse in use by PID N")` without touching the file (`locks.py`). `Warehouse.open` checks
that an existing file is readable (read-only, changing nothing) before writing to it, so a damaged file raises
`WarehouseDamaged`, and one a newer version wrote (migrations this code lacks) raises `WarehouseTooNew`; it
applies pending migrations once per open (a reader of a file written by an older
version applies them too, briefly as the writer). The errors live in `errors.py`.

JSON columns go in as dicts (`insert` stores their canonical text) and come back decoded from `records`, the
read the named queries use, so stages never parse JSON themselves; `rows` returns what DuckDB returns.
"""
# pyright: basic

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb

import sage.warehouse.locks as locks
from sage.warehouse.errors import (
    WarehouseBusy,
    busy,
    is_full,
    is_interrupt,
    no_space,
    not_a_directory,
    storage_error,
    too_new,
)

if TYPE_CHECKING:
    import pyarrow as pa

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
#: A statement's parameters: positional (`?`, a list) or named (`$name`, a dict).
Params = list | dict | None
T = TypeVar("T")
_MIGRATION_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
log = logging.getLogger(__name__)
#: Every JSON column of the tables, by name; each holds an object. `records` decodes them.
JSON_COLUMNS = frozenset({"config", "verifier", "parsed", "tests", "components", "metrics", "decoding"})


def _upgrade(path: str) -> None:
    """Apply the migrations a warehouse written by an older version lacks, for a reader: briefly as the writer
    when no one else is; while a writer holds the file, say so (its own migrations run when it next opens)."""
    holder = locks.acquire_writer(path)
    if holder is not None:
        raise busy(path, holder)
    try:
        with duckdb.connect(path) as con:
            Warehouse(path, False, con).migrate()
    finally:
        locks.release_writer(path)


_HEADER_BYTES = 3 * 4096  # DuckDB's file header and its two database headers, before the first block
_CHUNK_BLOCKS = 64          # blocks read at a time by the checksum pass (16 MiB at DuckDB's 256 KiB)


def _checksums(pages):
    """DuckDB's checksum (`Checksum` in its common/checksum.cpp: 5381 XOR-ed with every 64-bit word times
    0xbf58476d1ce4e5b9) of each row of `pages` (uint64 words) but the first word, where DuckDB stores it."""
    import numpy as np

    with np.errstate(over="ignore"):
        return np.bitwise_xor.reduce(pages[:, 1:] * np.uint64(0xBF58476D1CE4E5B9), axis=1) ^ np.uint64(5381)


def _bad_blocks(path: str, block_size: int, total: int, free: int) -> list[int]:
    """The blocks whose stored checksum does not match their bytes: DuckDB checks a block only when a query
    reads it, so index and unread data blocks go unchecked at open. A free block holds an earlier valid block,
    or zeros where it was never written; only the zeros are let pass, and only when the file has free blocks.
    When the checksum does not match even the two database headers, which DuckDB checked as it opened the
    file, this DuckDB stores blocks some other way: nothing is checked (the pass is never the cause of an
    error on a good file)."""
    import numpy as np

    words, bad = block_size // 8, []
    with open(path, "rb") as f:
        headers = np.frombuffer(f.read(_HEADER_BYTES), dtype="<u8").reshape(3, -1)[1:]
        if not (_checksums(headers) == headers[:, 0]).any():
            log.debug("block checksums not checked: this DuckDB's header checksum is not the one known here")
            return []
        for first in range(0, total, _CHUNK_BLOCKS):
            f.seek(_HEADER_BYTES + first * block_size)
            data = f.read(min(_CHUNK_BLOCKS, total - first) * block_size)
            blocks = np.frombuffer(data, dtype="<u8", count=len(data) // block_size * words).reshape(-1, words)
            for i in np.flatnonzero(_checksums(blocks) != blocks[:, 0]):
                if not (free and not blocks[i].any()):
                    bad.append(first + int(i))
    return bad


def _check_readable(path: str) -> None:
    """Check, without writing anything, that the file holds every block its header names, that every block's
    checksum matches and that every table's row count reads: DuckDB opens a truncated or overwritten file and
    fails only when a query (or the first write, reading an index) reaches the damaged block, and a read-write
    open of a damaged file could write to it. The checksum pass reads the whole file, about 1.3 ms a MB."""
    with duckdb.connect(path, read_only=True) as con:
        block_size, total, used, free = con.execute("SELECT block_size, total_blocks, used_blocks, free_blocks "
                                                    "FROM pragma_database_size()").fetchall()[0]
        need, have = _HEADER_BYTES + block_size * used, Path(path).stat().st_size  # at least; free blocks may go
        if have < need:
            raise duckdb.IOException(f"Could not read enough bytes: the file holds {have:,} bytes, its {used} "
                                     f"blocks in use need at least {need:,}")
        bad = _bad_blocks(path, block_size, min(total, (have - _HEADER_BYTES) // block_size), free)
        if bad:
            raise duckdb.IOException(f"Corrupt database file: block(s) {', '.join(map(str, bad[:5]))}"
                                     f"{' ...' if len(bad) > 5 else ''} fail their checksum")
        tables = [t for (t,) in con.execute("SELECT table_name FROM information_schema.tables "
                                            "WHERE table_type = 'BASE TABLE'").fetchall()]
        for table in tables:
            con.execute(f'SELECT count(*) FROM "{table}"').fetchall()


def _check_version(path: str) -> None:
    """Refuse, before anything is written, a file holding migrations this code does not have: a newer version
    of sage wrote it, and writing to it with the older schema in mind could corrupt what the newer one stored."""
    ours = len(migrations())
    with duckdb.connect(path, read_only=True) as con:
        has = con.execute("SELECT count(*) FROM information_schema.tables "
                          "WHERE table_name = 'migrations'").fetchall()[0][0]
        theirs = con.execute("SELECT coalesce(max(version), 0) FROM migrations").fetchall()[0][0] if has else 0
    if theirs > ours:
        raise too_new(path, theirs, ours)


def warehouse_path(directory: str | Path) -> Path:
    """The warehouse file of a project directory."""
    return Path(directory).expanduser() / "warehouse.duckdb"


def snapshot_path(path: str | Path) -> Path:
    """The read-only copy of the warehouse at `path` that a run refreshes after every stage
    (`Warehouse.snapshot`): `warehouse.snapshot.duckdb` beside it."""
    path = Path(path)
    return path.with_name(path.stem + ".snapshot" + path.suffix)


def decode_json(value) -> dict:
    """A stored JSON object as a dict. NULL, JSON null, text that does not parse and any value that is not an
    object all give {}, so code reading a bad row finds no fields instead of raising."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every file in migrations/, in order; numbering must be contiguous."""
    found = []
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        m = _MIGRATION_NAME.match(path.name)
        if not m:
            raise RuntimeError(f"migration file {path.name} must be named NNN_name.sql")
        found.append((int(m.group(1)), m.group(2), path.read_text(encoding="utf-8")))
    for expected, (version, name, _) in enumerate(found, start=1):
        if version != expected:
            raise RuntimeError(f"migrations must be numbered 001, 002, ... without gaps; found {version:03d}_{name}")
    return found


class Warehouse:
    """The warehouse of one file. The DuckDB connection exists only inside `held()` (every read and write below
    opens one; a `with wh.held():` block shares one across several calls, as a transaction does): outside it
    this process holds nothing, so other processes can read the file. An in-memory warehouse keeps its one
    connection open."""

    def __init__(self, path: str, read_only: bool = False, con: duckdb.DuckDBPyConnection | None = None):
        self.path = path
        self.read_only = read_only
        self._con = con                 # kept open only for ":memory:"
        self._depth = 0                 # nesting of held() blocks
        self._guard = threading.RLock()  # one thread at a time uses the connection
        self._writer = False            # whether this object holds the writer lock
        self._schemas: dict[str, dict[str, pa.DataType]] = {}

    @classmethod
    def open(cls, path: str | Path, read_only: bool = False, migrate: bool = True) -> Warehouse:
        """Check the file (a damaged one raises `WarehouseDamaged`), apply pending migrations once, and return
        the warehouse with the file released. Opening for writing takes the writer lock: a second writer gets
        `WarehouseBusy` at once."""
        path = str(path)
        if path == ":memory:":
            wh = cls(path, read_only, duckdb.connect(path))
            if migrate:
                wh.migrate()
            return wh
        if read_only and not Path(path).exists():
            raise FileNotFoundError(f"no warehouse at {path}; run `sage seed` or `sage run` first")
        wrong_kind = not_a_directory(path)
        if wrong_kind is not None:
            raise wrong_kind
        wh = cls(path, read_only)
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            if not read_only:
                holder = locks.acquire_writer(path)
                if holder is not None:
                    raise busy(path, holder)
                wh._writer = True
            if Path(path).exists():
                wh._retrying(lambda: _check_readable(path))
                wh._retrying(lambda: _check_version(path))
            if migrate and not read_only:
                wh.migrate()
            elif migrate and wh._pending():
                _upgrade(path)
        except BaseException as e:
            wh.close()
            error = storage_error(e, path) if isinstance(e, (duckdb.Error, OSError)) else None
            if error is None:
                raise
            raise error from None
        return wh

    def close(self) -> None:
        with self._guard:
            if self._con is not None:
                self._con.close()
                self._con, self._depth = None, 0
            if self._writer:
                locks.release_writer(self.path)
                self._writer = False

    @contextmanager
    def held(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """The open connection for the time of the block: opened (waiting while another process holds the
        file) by the outermost block and closed when it ends, which releases the file."""
        with self._guard:
            self._depth += 1
            try:
                con = self._con
                if con is None:
                    con = self._con = self._retrying(lambda: duckdb.connect(self.path, read_only=self.read_only))
                yield con
            except (duckdb.Error, OSError) as e:
                if is_full(e) and self.path != ":memory:":  # named here, where the file is known
                    raise no_space(self.path) from e
                raise
            finally:
                self._depth -= 1
                if self._depth == 0 and self.path != ":memory:":
                    con, self._con = self._con, None
                    if con is not None:  # None when opening it failed
                        con.close()

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The connection of the enclosing `held()` block."""
        if self._con is None or (self._depth == 0 and self.path != ":memory:"):
            raise RuntimeError("the warehouse connection exists only inside `with wh.held():`")
        return self._con

    def _retrying(self, connect: Callable[[], T]) -> T:
        """`connect()`, retried while another process holds the file: a reader gives up after
        `locks.READ_WAIT_S`; the writer waits for readers as long as they hold it (saying so once), and gives
        up at once only when another program holds the file for writing."""
        start, noted = time.monotonic(), False
        for delay in locks.backoff():
            try:
                return connect()
            except duckdb.Error as e:
                error = storage_error(e, self.path)
                if not isinstance(error, WarehouseBusy):
                    raise
                waited = time.monotonic() - start
                if self.read_only:
                    if waited > locks.READ_WAIT_S:
                        raise error from None
                else:
                    holder = locks.lock_holder(self.path)
                    if holder is not None and holder[0] == "write":
                        raise error from None
                    if not noted and waited > locks.WAIT_NOTE_S and holder is not None:
                        log.warning("waiting for PID %s, which is reading the warehouse %s", holder[1], self.path)
                        noted = True
            time.sleep(delay)
        raise AssertionError("locks.backoff() ends")  # it never does: the loop returns or raises

    def checkpoint(self) -> None:
        """Write the write-ahead log into the database file, so a damaged log can lose at most what came after."""
        self.execute("CHECKPOINT")

    def snapshot(self) -> Path | None:
        """Checkpoint, then copy the file to `snapshot_path` (through a temporary file and a rename, so a client
        sees the old copy or the new one, whole; a copy that fails, on a full disk, is removed, and the error
        names the copy and the space it needs). Any DuckDB client can keep the copy open for as long as it
        likes: the run never waits for it and it is never refused, as a reader of the live file can be while a
        batch commits. None for an in-memory or read-only warehouse.

        The copy is made with no connection open in this process: reading the file through another descriptor
        and closing it would drop the POSIX lock DuckDB holds on it (see `locks.lock_holder`)."""
        if self.path == ":memory:" or self.read_only:
            return None
        with self._guard:
            if self._depth:
                raise RuntimeError("snapshot() inside `with wh.held():` would drop DuckDB's lock on the file")
            self.checkpoint()   # opens, checkpoints and closes: the file alone holds every committed row
            target = snapshot_path(self.path)
            partial = target.with_name(target.name + ".partial")
            try:
                shutil.copyfile(self.path, partial)
                os.replace(partial, target)
            except BaseException as e:
                partial.unlink(missing_ok=True)  # a part copy must not keep the space the next commit needs
                if isinstance(e, OSError) and e.errno == 28:
                    raise no_space(self.path, Path(self.path).stat().st_size, copy=target) from e
                raise
            return target

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- schema ---------------------------------------------------------------------------------------
    def _pending(self) -> list[int]:
        """Migrations a read-only open finds not applied (a warehouse written by an older version)."""
        with self.held() as con:
            has = con.execute("SELECT count(*) FROM information_schema.tables "
                              "WHERE table_name = 'migrations'").fetchall()[0][0]
            done = {v for (v,) in con.execute("SELECT version FROM migrations").fetchall()} if has else set()
        return [v for v, _, _ in migrations() if v not in done]

    def migrate(self) -> list[int]:
        """Apply the migrations not yet recorded; each in its own transaction. Returns versions applied."""
        with self.held():
            return self._migrate()

    def _migrate(self) -> list[int]:
        self.con.execute("CREATE TABLE IF NOT EXISTS migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL,"
                         " applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)")
        done = {v for (v,) in self.con.execute("SELECT version FROM migrations").fetchall()}
        applied = []
        for version, name, sql in migrations():
            if version in done:
                continue
            with self.transaction():
                self.con.execute(sql)
                self.con.execute("INSERT INTO migrations (version, name) VALUES (?, ?)", [version, name])
            applied.append(version)
        return applied

    def schema_version(self) -> int:
        return self.scalar("SELECT coalesce(max(version), 0) FROM migrations")

    # -- writes ---------------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction, with the file held from BEGIN to COMMIT (or ROLLBACK) and released after."""
        with self.held() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def execute(self, sql: str, params: Params = None) -> list[tuple]:
        """Run one statement (in the caller's transaction if there is one) and return its rows as tuples."""
        with self.held() as con:
            return con.execute(sql, params or []).fetchall()

    def insert(self, table: str, rows: list[dict]) -> int:
        """Insert rows (dicts keyed by column) with ON CONFLICT DO NOTHING; returns rows actually added.
        Runs inside the caller's transaction if there is one."""
        if not rows:
            return 0
        columns = list(dict.fromkeys(k for r in rows for k in r))  # union of keys; missing ones are NULL
        schema = self._arrow_schema(table, columns)
        import pyarrow as pa  # here, not at the top: `sage sql` and `sage status` start without it

        text_cols = [c for c in columns if pa.types.is_string(schema.field(c).type)]
        if text_cols:  # JSON columns arrive as dicts/lists: store their canonical JSON text
            rows = [{**r, **{c: json.dumps(r[c], sort_keys=True, default=str) for c in text_cols
                             if r.get(c) is not None and not isinstance(r[c], str)}} for r in rows]
        arrow = pa.Table.from_pylist(rows, schema=schema)
        with self.held():
            return self._insert_arrow(table, columns, arrow)

    def _insert_arrow(self, table: str, columns: list[str], arrow: pa.Table) -> int:
        cols = ", ".join(columns)
        before = self.count(table)
        self.con.register("_incoming", arrow)
        try:
            self.con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _incoming ON CONFLICT DO NOTHING")
        except duckdb.Error as e:
            if is_interrupt(e):  # a signal during the statement: give the caller back the KeyboardInterrupt
                raise KeyboardInterrupt(str(e)) from e
            raise
        finally:
            with suppress(duckdb.Error):  # an aborted transaction refuses it; the caller rolls back
                self.con.unregister("_incoming")
        return self.count(table) - before

    def insert_batch(self, table: str, rows: list[dict]) -> int:
        """`insert` in its own transaction: the batch lands whole or not at all."""
        with self.transaction():
            return self.insert(table, rows)

    def count(self, table: str) -> int:
        return self.scalar(f"SELECT count(*) FROM {table}")

    def _arrow_schema(self, table: str, columns: list[str]) -> pa.Schema:
        # Arrow types from the table's DuckDB types, so JSON, lists and NULL-only columns convert exactly.
        types = self._schemas.get(table)
        if types is None:
            with self.held() as con:
                empty = con.sql(f"SELECT * FROM {table} LIMIT 0").to_arrow_table()
            types = {f.name: f.type for f in empty.schema}
            self._schemas[table] = types
        unknown = [c for c in columns if c not in types]
        if unknown:
            raise KeyError(f"table {table} has no column(s) {unknown}")
        import pyarrow as pa

        return pa.schema([(c, types[c]) for c in columns])

    # -- reads ----------------------------------------------------------------------------------------
    def query(self, sql: str, params: list | None = None):
        """Run SQL and return a pandas DataFrame."""
        with self.held() as con:
            return con.execute(sql, params or []).df()

    def rows(self, sql: str, params: Params = None) -> list[dict]:
        with self.held() as con:
            cur = con.execute(sql, params or [])
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]

    def records(self, sql: str, params: Params = None) -> list[dict]:
        """`rows`, with every selected column named in JSON_COLUMNS decoded by `decode_json` (always a dict)."""
        rows = self.rows(sql, params)
        decode = [c for c in (rows[0] if rows else ()) if c in JSON_COLUMNS]
        for r in rows:
            for c in decode:
                r[c] = decode_json(r[c])
        return rows

    def scalar(self, sql: str, params: Params = None) -> Any:
        """The first column of the first row, None when there is no row; its type is the query's (a count is an int)."""
        row = self.execute(sql, params)
        return row[0][0] if row else None
