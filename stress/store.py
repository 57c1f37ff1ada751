"""The results store: SQLite in WAL mode, one row per run, committed the moment it ends.

Default location `.hazards/results.db` in the working directory; `HZ_STORE` or an
explicit path overrides it. Several processes may write at once (WAL + busy timeout +
`BEGIN IMMEDIATE` for every write). A writer killed at any point leaves a consistent
database: each run is its own transaction, so every run that finished is present.
More in docs/campaigns.md.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import sqlite3
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import StoreError, UserError
from .outcome import OUTCOMES, HOST, Outcome, RunResult, item_key
from .signatures import signature_of
from .stats import CiMethod, rate_ci, upper_bound

DEFAULT_PATH = Path(".hazards") / "results.db"
BUSY_TIMEOUT_MS = 60_000
SPILL_SUFFIX = ".spill.jsonl"
SPILL_FORMAT = "hazards-spill/1"

log = logging.getLogger(__name__)

# Version 1 of the schema, as the first stores were made. Never edit it: change the schema
# with a migration (below), so that stores made before the change can follow.
_SCHEMA_V1 = """
CREATE TABLE campaigns (
    id       INTEGER PRIMARY KEY,
    kind     TEXT NOT NULL,
    name     TEXT,
    spec     TEXT NOT NULL,
    created  REAL NOT NULL,
    status   TEXT NOT NULL,
    host     TEXT NOT NULL
);
CREATE TABLE signatures (
    id          INTEGER PRIMARY KEY,
    key         TEXT NOT NULL UNIQUE,
    outcome     TEXT NOT NULL,
    error_kind  TEXT NOT NULL,
    target      TEXT NOT NULL,
    variant     TEXT NOT NULL,
    message     TEXT NOT NULL,
    first_seen  REAL NOT NULL,
    last_seen   REAL NOT NULL,
    count       INTEGER NOT NULL
);
CREATE TABLE runs (
    id            INTEGER PRIMARY KEY,
    campaign_id   INTEGER NOT NULL REFERENCES campaigns(id),
    seq           INTEGER NOT NULL,
    target        TEXT NOT NULL,
    variant       TEXT NOT NULL,
    params        TEXT NOT NULL,
    outcome       TEXT NOT NULL CHECK (outcome IN ('clean','hang','fault','mismatch','error')),
    reason        TEXT NOT NULL,
    error_kind    TEXT,
    evidence      TEXT NOT NULL,
    metrics       TEXT NOT NULL,
    started_at    REAL NOT NULL,
    duration_s    REAL NOT NULL,
    host          TEXT NOT NULL,
    gpu_uuid      TEXT,
    worker_age    INTEGER NOT NULL,
    artifact_dir  TEXT,
    signature_id  INTEGER REFERENCES signatures(id),
    UNIQUE (campaign_id, seq)
);
CREATE INDEX runs_by_target ON runs (target, variant);
CREATE INDEX runs_by_signature ON runs (signature_id);
"""


@dataclasses.dataclass(frozen=True)
class Migration:
    """One forward step of the schema, to version `to` from `to - 1`: `sql` (statements
    separated by `;`) or `apply(db)` for a step SQL alone cannot say. It runs inside the
    migration's transaction, with foreign-key enforcement off (a table rebuild is possible);
    the references are checked before the commit."""

    to: int
    what: str  # one line for `hazards store check|migrate`
    sql: str = ""
    apply: Callable[[sqlite3.Connection], None] | None = None

    def run(self, db: sqlite3.Connection) -> None:
        for stmt in self.sql.split(";"):
            if stmt.strip():
                db.execute(stmt)
        if self.apply is not None:
            self.apply(db)


# The migrations, in order: MIGRATIONS[i].to == i + 2. Append only; never edit a released one
# (stores in the field have run it). Test: tests/engine/test_store_migrations.py migrates the
# stored version-1 database (tests/data/store-v1.db) and compares it with a new store.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(2, "progress_calibration: gaps between progress events of clean runs per item, server start-ups "
                 "per target (stall windows and handshake waits, docs/stall.md)",
              sql="""CREATE TABLE progress_calibration (
    item           TEXT PRIMARY KEY,
    runs           INTEGER NOT NULL DEFAULT 0,
    gaps           TEXT NOT NULL DEFAULT '{}',
    startup_max_s  REAL,
    updated        REAL NOT NULL DEFAULT 0
)"""),
)
SCHEMA_VERSION = 1 + len(MIGRATIONS)
assert all(m.to == i + 2 for i, m in enumerate(MIGRATIONS)), "MIGRATIONS must be numbered 2, 3, ..."
MIGRATE_TRIES = 5  # backups retaken when other writers commit between the backup and the lock


@dataclasses.dataclass
class Campaign:
    """One stored campaign: what was asked (`spec`) and how far it got (`status`)."""

    id: int
    kind: str
    name: str | None
    spec: dict[str, Any]
    created: float
    status: str
    host: str


@dataclasses.dataclass
class StoredRun:
    """A run as stored: its place in a campaign plus the judged result."""

    id: int
    campaign_id: int
    seq: int
    signature_id: int | None
    result: RunResult


@dataclasses.dataclass
class Signature:
    """A group of failures that look the same; `count` is over the selection asked for."""

    id: int
    key: str
    outcome: str
    error_kind: str
    target: str
    variant: str
    message: str
    first_seen: float
    last_seen: float
    count: int


class OutcomeCounts:
    """Derived numbers of a `counts` mapping (outcome -> runs); mixed into result classes."""

    counts: dict[str, int]

    @property
    def n(self) -> int:
        return sum(self.counts.values())

    @property
    def failures(self) -> int:
        """Runs that observed a hazard (hang, fault, mismatch)."""
        return sum(c for o, c in self.counts.items() if Outcome(o).is_failure)

    @property
    def errors(self) -> int:
        """Runs that ended in `error` (our infrastructure, not the target)."""
        return self.counts.get(Outcome.ERROR.value, 0)

    @property
    def judged(self) -> int:
        """Runs with a verdict on the hazard: all but `error`."""
        return self.n - self.errors

    def rate(self) -> float | None:
        """Failure rate over judged runs (None when there are none)."""
        return self.failures / self.judged if self.judged else None

    def ci(self, conf: float = 0.95, method: CiMethod = "exact") -> tuple[float, float]:
        """Two-sided interval on the failure rate over judged runs."""
        return rate_ci(self.failures, self.judged, conf, method)

    def upper(self, conf: float = 0.95) -> float:
        """One-sided exact upper bound on the failure rate over judged runs."""
        return upper_bound(self.failures, self.judged, conf)


@dataclasses.dataclass
class Tally(OutcomeCounts):
    """Outcome counts of one target/variant (optionally within one campaign)."""

    target: str
    variant: str
    counts: dict[str, int]


def empty_counts() -> dict[str, int]:
    """A count of zero for each of the five outcomes, in their canonical order."""
    return {o.value: 0 for o in OUTCOMES}


def resolve_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The store path: `path` if given, else $HZ_STORE, else .hazards/results.db."""
    if path is not None and str(path) != "":
        return Path(path)
    env = os.environ.get("HZ_STORE")
    return Path(env) if env else DEFAULT_PATH


@dataclasses.dataclass(frozen=True)
class StoreLayout:
    """Every path that belongs to the results store whose database file is `db`: the one place
    that names them (artifacts/, reports/ and the example database beside it, its spill files
    and backups); commands ask `Store.layout` (or `StoreLayout.of(path)` without an open store)."""

    db: Path

    @classmethod
    def of(cls, path: str | os.PathLike[str] | None = None) -> "StoreLayout":
        """The layout of the store `path` names (None: $HZ_STORE, else the default)."""
        return cls(resolve_path(path))

    def artifacts(self, campaign_id: int) -> Path:
        """A campaign's artifact folder, beside the database (not created here); absolute,
        so the runs' stored folders do not depend on the folder the command ran in."""
        return self.db.absolute().parent / "artifacts" / f"campaign-{int(campaign_id)}"

    def report(self, campaign_id: int) -> Path:
        """A campaign's HTML report unless the user names a file (`hazards report`, `soak`)."""
        return self.db.parent / "reports" / f"campaign-{int(campaign_id)}.html"

    @property
    def examples(self) -> Path:
        """The hypothesis example database (`hazards explore`, soak's explore share, check's
        replay, the nightly profile): `hypothesis/` beside the database."""
        return self.db.parent / "hypothesis"

    @property
    def spills(self) -> list[Path]:
        """Where runs the store could not commit are spilled, in order of preference: beside
        the store, the per-user state folder, the per-user temporary folder."""
        p = self.db.absolute()
        name = f"{p.name}-{hashlib.sha256(str(p).encode()).hexdigest()[:16]}{SPILL_SUFFIX}"
        xdg = os.environ.get("XDG_STATE_HOME")
        state = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
        return [p.with_name(p.name + SPILL_SUFFIX), state / "gpu-hazards" / "spill" / name,
                Path(tempfile.gettempdir()) / f"gpu-hazards-{os.getuid()}" / name]

    @staticmethod
    def unreadable(spill: Path) -> Path:
        """Where a spill file with lines that could not be read is kept."""
        return spill.with_name(spill.name + ".unreadable")

    def backup(self, version: int, stamp: str, n: int = 1) -> Path:
        """The copy of a version-`version` store made before a migration (`n` > 1: another in
        the same second)."""
        return self.db.with_name(f"{self.db.name}.v{version}-backup-{stamp}" + (f"-{n}" if n > 1 else ""))


def _json(value: Any) -> str:
    """JSON for a stored column; non-finite floats and odd objects must not lose the run."""
    def fallback(o: Any) -> Any:
        if isinstance(o, (set, tuple)):
            return list(o)
        if isinstance(o, Path):
            return str(o)
        return repr(o)

    try:
        return json.dumps(value if value is not None else {}, default=fallback, allow_nan=True)
    except (TypeError, ValueError):
        return json.dumps({"unserialisable": repr(value)})


def _finite_or_zero(value: Any) -> float:
    """A REAL column's value: a missing (None) or non-finite time must not lose the run."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) else 0.0


def _no_store(path: Path) -> UserError:
    """The one-line error for a --store that names no store file (a folder, or nothing)."""
    if path.is_dir():
        return UserError(f"store path {path} is a folder; give the database file, such as {path / DEFAULT_PATH.name}")
    return UserError(f"no results store at {path} (run `hazards run` first, or pass --store)")


def _check_writable(path: Path) -> None:
    """Refuse a store path we could not write, creating only its own folder: a store that
    exists and cannot be written is a store failure (StoreError, exit 4, as for every
    command); a path where none can be made is bad input (UserError)."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise _no_store(path)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create store folder {parent}: {e.strerror or e}") from None
    if not parent.is_dir():
        raise UserError(f"cannot use store path {path}: {parent} is not a directory")
    # os.access is not enough (root passes it on read-only mounts and /proc): probe
    # with a real file next to the store, removed at once.
    probe = parent / f".hz-write-probe-{os.getpid()}"
    try:
        with open(probe, "wb"):
            pass
    except OSError as e:
        if path.exists():
            raise _read_only(path, e.strerror or str(e)) from None
        raise UserError(f"store path {path} is not writable: {e.strerror or e}") from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    if path.exists() and not os.access(path, os.W_OK):
        raise _read_only(path, "the file is not writable")


def _read_only(path: Path, why: str) -> StoreError:
    return StoreError(f"results store {path} is read-only ({why}): {_advice('SQLITE_READONLY', path)}")


# -- SQLite failures as StoreError ---------------------------------------------------------
def _advice(name: str, path: Path) -> str:
    """What to do about SQLite error `name` (e.g. SQLITE_IOERR_WRITE) on the store `path`."""
    primary = "_".join(name.split("_")[:2])
    if primary == "SQLITE_FULL":
        return ("the disk is full (or the database reached its size limit): free space, or point "
                "--store/HZ_STORE at another disk")
    if primary in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
        return (f"the file is damaged: move it aside (`mv {path} {path}.damaged`; the next run starts a "
                f"new store) and recover its runs with `sqlite3 {path}.damaged .recover`")
    if primary in ("SQLITE_READONLY", "SQLITE_PERM", "SQLITE_AUTH"):
        return "it cannot be written: make the file and its folder writable, or point --store elsewhere"
    if primary in ("SQLITE_BUSY", "SQLITE_LOCKED"):
        return (f"another process held its write lock for over {BUSY_TIMEOUT_MS // 1000} s: find it "
                f"with `fuser {path}`, or retry later")
    if primary == "SQLITE_IOERR":
        return "reading or writing it failed: check the disk and the filesystem (dmesg)"
    if primary == "SQLITE_CANTOPEN":
        return "it cannot be opened: check that the file and its folder exist and are accessible"
    return "check the file, or point --store at another one"


def store_error(path: Path, e: sqlite3.Error) -> StoreError:
    """A one-line StoreError for an SQLite failure on the store at `path`."""
    name = getattr(e, "sqlite_errorname", "") or ""
    return StoreError(f"results store {path}: {e} ({name or type(e).__name__}): {_advice(name, path)}")


def _ours(e: sqlite3.Error) -> bool:
    """Is this failure the database's (a StoreError), rather than a bug in our SQL?"""
    return not isinstance(e, (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError))


class _Cursor(sqlite3.Cursor):
    """A cursor whose SQLite failures are StoreErrors naming the store."""

    def _fail(self, e: sqlite3.Error) -> Exception:
        return store_error(self.connection.hz_path, e) if _ours(e) else e  # type: ignore[attr-defined]

    def execute(self, *args: Any) -> "_Cursor":
        try:
            return super().execute(*args)
        except sqlite3.Error as e:
            raise self._fail(e) from None

    def fetchone(self) -> Any:
        try:
            return super().fetchone()
        except sqlite3.Error as e:
            raise self._fail(e) from None

    def __next__(self) -> Any:
        try:
            return super().__next__()
        except sqlite3.Error as e:
            raise self._fail(e) from None


def storable_text(text: str) -> str:
    """`text` as valid UTF-8: a non-UTF-8 byte that came in through surrogateescape (a
    program argument, a file name) is stored escaped as `\\xff`, any other lone surrogate as
    `\\udXXX`; SQLite refuses them raw, and the run would be lost."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:
            return text.encode("utf-8", "backslashreplace").decode("utf-8")


class _Connection(sqlite3.Connection):
    """A connection whose `execute` returns `_Cursor`s (SQLite failures become StoreErrors)
    and stores every text as valid UTF-8 (`storable_text`)."""

    hz_path: Path

    def execute(self, sql: str, params: Any = ()) -> _Cursor:  # type: ignore[override]
        if isinstance(params, (tuple, list)):
            params = tuple(storable_text(p) if isinstance(p, str) else p for p in params)
        return self.cursor(_Cursor).execute(sql, params)


def _connect(path: Path, *, read_only: bool) -> _Connection:
    """A connection to the store. Read-only (`query_only`): a plain connection where
    SQLite can use the folder (closing it tidies the WAL files away, as a writer's does),
    else `mode=ro`, else `immutable=1` (a read-only mount where SQLite cannot create the
    WAL index beside the store)."""
    kw: dict[str, Any] = dict(timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False,
                              factory=_Connection)
    base = "file:" + urllib.parse.quote(str(path.absolute()))
    attempts = [str(path)] if not read_only else [base + "?mode=rw", base + "?mode=ro",
                                                      base + "?mode=ro&immutable=1"]
    for i, target in enumerate(attempts):
        last = i == len(attempts) - 1
        try:
            db = sqlite3.connect(target, uri=target.startswith("file:"), **kw)
        except sqlite3.OperationalError as e:
            if last:
                raise store_error(path, e) from None
            continue
        except sqlite3.Error as e:
            raise store_error(path, e) from None
        db.hz_path = path
        if not read_only:
            return db
        try:
            db.execute("PRAGMA query_only = ON")
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except StoreError as e:
            db.close()
            if last or "SQLITE_CANTOPEN" not in str(e) and "SQLITE_READONLY" not in str(e):
                raise
    raise AssertionError("unreachable")


# -- spill files: finished runs the store could not take ---------------------------------------
def spill_run(store_path: str | os.PathLike[str], campaign: "Campaign | None", campaign_id: int, seq: int,
              result: RunResult) -> str:
    """Append a finished run the store could not commit to the first spill file that takes
    it (fsynced); the path written, or 'stderr' when none could be (the record is printed
    there, one JSON line, so the log keeps it)."""
    record = {"format": SPILL_FORMAT, "store": str(Path(store_path).absolute()), "spilled_at": time.time(),
              "campaign": dataclasses.asdict(campaign) if campaign else {"id": int(campaign_id)},
              "seq": int(seq), "result": result.to_json()}
    line = _json(record) + "\n"
    for path in StoreLayout(Path(store_path)).spills:
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(path, "a", encoding="utf-8") as f:
                start = f.tell()
                try:
                    f.write(line)
                    f.flush()
                    os.fsync(f.fileno())
                except OSError:
                    f.truncate(start)  # no torn record left behind (nor an empty file we made)
                    raise
            return str(path)
        except OSError:
            if path.is_file() and path.stat().st_size == 0:
                path.unlink(missing_ok=True)
            continue
    sys.stderr.write("hazards: spilled run: " + line)
    return "stderr"


def _id_ranges(ids: list[int]) -> str:
    """1, 2, 3, 5 -> '1-3, 5': the valid ids of a store in one short phrase."""
    spans: list[list[int]] = []
    for i in ids:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


@dataclasses.dataclass(frozen=True)
class Migrated:
    """A store taken from one schema version to another; `backup` is the file as it was."""

    from_version: int
    to_version: int
    backup: Path

    def describe(self, path: Path) -> str:
        return (f"migrated results store {path} from schema version {self.from_version} to {self.to_version}; "
                f"the file as it was is kept as {self.backup}")


@dataclasses.dataclass(frozen=True)
class StoreState:
    """Where a store stands (`inspect_store`): its schema version, the migrations it
    lacks, SQLite's integrity check and the spill files waiting to be imported."""

    path: Path
    version: int
    pending: tuple[Migration, ...]
    integrity: str
    spills: tuple[Path, ...]

    @property
    def sound(self) -> bool:
        return self.integrity == "ok"


def _schema_version(db: sqlite3.Connection, path: Path) -> int:
    """The store's schema version: 0 for an empty file; UserError for an SQLite database
    that is not a results store."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version == 0 and db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        raise UserError(f"{path} is an SQLite database but not a hazards results store")
    return version


def _newer_message(path: Path, version: int) -> str:
    return (f"results store {path} has schema version {version}, newer than this hazards knows (up to "
            f"{SCHEMA_VERSION}): use a newer hazards (pip install -U gpu-hazards) or another --store; "
            "the store was not changed")


def _older_message(path: Path, version: int) -> str:
    return (f"results store {path} has schema version {version}; this hazards reads version {SCHEMA_VERSION}: "
            f"run `hazards store migrate --store {path}` (it backs the file up first)")


def _backup(db: sqlite3.Connection, path: Path, version: int) -> Path:
    """A consistent copy of the store beside it (SQLite's online backup, as one self-contained
    file), made before a migration; StoreError when it cannot be made (nothing changed)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    n = 1
    dest = StoreLayout(path).backup(version, stamp)
    while dest.exists():
        n += 1
        dest = StoreLayout(path).backup(version, stamp, n)
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    try:
        copy = sqlite3.connect(tmp)
        try:
            db.backup(copy)
            copy.execute("PRAGMA journal_mode = DELETE")  # no -wal beside the copy
        finally:
            copy.close()
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except (sqlite3.Error, OSError) as e:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"results store {path}: could not back it up to {dest} before migrating it "
                         f"({getattr(e, 'strerror', None) or e}); it was not changed: free space beside it, "
                         "or copy it elsewhere and migrate the copy") from None
    return dest


def _apply_migrations(db: sqlite3.Connection, path: Path, version: int, backup: Path | None = None) -> None:
    """Run the migrations after `version` inside the caller's transaction and set the new
    version; a failing step (or a dangling reference after them) is a StoreError and, the
    caller's transaction rolling back, leaves the store as it was."""
    step = None
    try:
        for step in MIGRATIONS[version - 1:]:
            step.run(db)
        step = None
        dangling = db.execute("PRAGMA foreign_key_check").fetchone()
        if dangling is not None:
            raise StoreError(f"a row of table {dangling[0]} refers to a missing row of {dangling[2]}")
    except (sqlite3.Error, StoreError) as e:
        where = f"the step to version {step.to} ({step.what})" if step else "the check of its references"
        kept = f"; the backup {backup} is the same" if backup else ""
        raise StoreError(f"results store {path}: migrating it from schema version {version} failed in {where}: "
                         f"{e}; the store is unchanged (version {version}){kept}") from None
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def inspect_store(path: str | os.PathLike[str] | None = None) -> StoreState:
    """Where the store at `path` stands, read without changing it. UserError for a missing
    file, an SQLite database that is not a results store, or a newer schema than this
    hazards knows; StoreError when SQLite cannot read it."""
    p = resolve_path(path)
    if not p.is_file():
        raise _no_store(p)
    db = _connect(p, read_only=True)
    try:
        version = _schema_version(db, p)
        if version > SCHEMA_VERSION:
            raise UserError(_newer_message(p, version))
        if version == 0:  # no schema at all: nothing to migrate (the next writing command creates one)
            raise UserError(f"{p} is an empty results store: no schema yet (the next run, soak or check "
                            "creates it)")
        integrity = str(db.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        db.close()
    return StoreState(p, version, MIGRATIONS[max(version, 1) - 1:], integrity,
                      tuple(s for s in StoreLayout(p).spills if s.is_file()))


class Store:
    """A results database. Open it, create campaigns, record runs, query them.

    `create=False` opens an existing store only: a missing file is a UserError and nothing
    is created. `read_only=True` (implies `create=False`) never writes: the commands that
    only read (`stats`, `report`, `compare`) use it, and it works on a read-only mount.
    Opening for writing migrates an older store (after a backup; `migrated` says so) and
    imports the runs of any spill file (`import_spills`).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, create: bool = True,
                 read_only: bool = False, say_migrated: bool = True) -> None:
        self.path = resolve_path(path)
        self.layout = StoreLayout(self.path)  # where its artifacts, reports, examples and spills are
        self.read_only = read_only
        self.migrated: Migrated | None = None  # set when this open migrated the store
        self._say_migrated = say_migrated  # `hazards store migrate` says it itself
        create = create and not read_only
        if create:
            _check_writable(self.path)
        elif not self.path.is_file():
            raise _no_store(self.path)
        elif not read_only:
            _check_writable(self.path)  # an existing store to write: read-only is exit 4 here too
        self._db = _connect(self.path, read_only=read_only)
        try:
            self._setup(create)
            if read_only:
                self._mention_spills()
            else:
                self.import_spills()
        except BaseException:
            self._db.close()
            raise

    # -- setup -------------------------------------------------------------------------
    def _setup(self, create: bool) -> None:
        db = self._db
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        version = _schema_version(db, self.path)
        if version == 0:
            if not create:
                raise UserError(f"{self.path} is an empty results store")
            self._create_schema()
        elif version > SCHEMA_VERSION:
            raise UserError(_newer_message(self.path, version))
        elif version < SCHEMA_VERSION:
            if self.read_only:
                raise UserError(_older_message(self.path, version))
            self.migrated = self._migrate()
        if create and db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            db.execute("PRAGMA journal_mode = WAL")
        # NORMAL in WAL mode loses no committed transaction when the process dies; only a
        # power cut can lose the last few (acceptable for stress results).
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA foreign_keys = ON")

    def _create_schema(self) -> None:
        self._db.execute("PRAGMA journal_mode = WAL")
        with self._write() as db:
            # another process may have created it while we waited for the lock
            if db.execute("PRAGMA user_version").fetchone()[0] == 0:
                for stmt in _SCHEMA_V1.split(";"):
                    if stmt.strip():
                        db.execute(stmt)
                _apply_migrations(db, self.path, 1)

    def _migrate(self) -> "Migrated | None":
        """Back the store up, then take it to SCHEMA_VERSION in one transaction. The backup
        is retaken when another process commits between the backup and the write lock (it
        must hold every run the migrated store holds); None when another process migrated
        it meanwhile."""
        db = self._db
        db.execute("PRAGMA foreign_keys = OFF")  # a no-op inside a transaction: set before
        for _ in range(MIGRATE_TRIES):
            seen = db.execute("PRAGMA data_version").fetchone()[0]
            version = _schema_version(db, self.path)
            if version >= SCHEMA_VERSION:
                return None
            backup = _backup(db, self.path, version)
            with self._write() as db:
                if db.execute("PRAGMA data_version").fetchone()[0] == seen:
                    _apply_migrations(db, self.path, version, backup)
                    done = Migrated(version, SCHEMA_VERSION, backup)
                    break
            backup.unlink(missing_ok=True)  # stale: retaken on the next try
        else:
            raise StoreError(f"results store {self.path}: other processes kept writing to it while it was being "
                             f"migrated ({MIGRATE_TRIES} tries); stop them and run `hazards store migrate "
                             f"--store {self.path}`")
        if self._say_migrated:
            log.warning("hazards: %s", done.describe(self.path))
        return done

    # -- spilled runs ----------------------------------------------------------------------
    def spill(self, campaign_id: int, seq: int, result: RunResult, campaign: Campaign | None = None) -> str:
        """Keep a finished run this store could not commit (see `spill_run`); where it went."""
        return spill_run(self.path, campaign, campaign_id, seq, result)

    def import_spills(self) -> int:
        """Import every spill file of this store (runs it could not commit earlier) into
        their campaigns, then remove the file; how many runs were imported. A campaign this
        store does not hold (the store was replaced since) is recreated as 'interrupted',
        its spec saying where it came from. Safe to repeat: a run already stored is skipped."""
        total = 0
        for path in self.layout.spills:
            if not path.is_file():
                continue
            records, bad = _read_spill(path)
            made: dict[tuple, int] = {}
            n = 0
            for rec in records:
                cid = self._spill_campaign(rec, path, made)
                seq = int(rec["seq"])
                if self._db.execute("SELECT 1 FROM runs WHERE campaign_id = ? AND seq = ?", (cid, seq)).fetchone():
                    continue
                self.record_run(cid, RunResult.from_json(rec["result"]), seq=seq)
                n += 1
            if bad:
                kept = StoreLayout.unreadable(path)
                os.replace(path, kept)
                log.warning("hazards: %d line(s) of spill file %s could not be read; kept as %s", bad, path, kept)
            else:
                path.unlink(missing_ok=True)
            if n:
                log.warning("hazards: imported %d run(s) the store could not take earlier from %s into %s",
                            n, path, self.path)
            total += n
        return total

    def _spill_campaign(self, rec: dict[str, Any], spill: Path, made: dict[tuple, int]) -> int:
        """The campaign of this store a spilled run belongs to (recreated if it is gone)."""
        c = rec.get("campaign") or {}
        key = (c.get("id"), c.get("kind"), c.get("created"))
        if key in made:
            return made[key]
        row = self._db.execute("SELECT kind, created FROM campaigns WHERE id = ?", (int(c.get("id", 0)),)).fetchone()
        if row is not None and (c.get("kind") is None or (row[0] == c.get("kind")
                                                          and abs(row[1] - float(c.get("created", 0))) < 1e-3)):
            made[key] = int(c["id"])
            return made[key]
        origin = {"campaign": c.get("id"), "created": c.get("created"), "store": rec.get("store")}
        for camp in self.campaigns(c.get("kind") or "recovered"):
            if camp.spec.get("recovered_from") == origin:  # imported before, then interrupted
                made[key] = camp.id
                return camp.id
        spec = {**(c.get("spec") or {}), "recovered_from": origin}
        cid = self.create_campaign(c.get("kind") or "recovered", spec, name=c.get("name"))
        self.set_campaign_status(cid, "interrupted")
        log.warning("hazards: campaign %s of the spill file %s is not in %s: its runs go to new campaign %d",
                    c.get("id"), spill, self.path, cid)
        made[key] = cid
        return cid

    def _mention_spills(self) -> None:
        waiting = [p for p in self.layout.spills if p.is_file()]
        if waiting:
            log.warning("hazards: %s holds runs this store could not take; open the store for writing "
                        "(any hazards run/soak/check, or --resume) to import them", ", ".join(map(str, waiting)))

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._db is not None:
            self._db.close()
            self._db = None  # type: ignore[assignment]

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> "_Txn":
        return _Txn(self._db)

    # -- campaigns -----------------------------------------------------------------------
    def create_campaign(self, kind: str, spec: dict[str, Any], name: str | None = None) -> int:
        """Create a campaign (status 'running') and return its id."""
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO campaigns (kind, name, spec, created, status, host) VALUES (?,?,?,?,?,?)",
                (kind, name, _json(spec), time.time(), "running", HOST))
            return int(cur.lastrowid)

    def campaign(self, campaign_id: int) -> Campaign:
        """The campaign with this id; UserError if there is none."""
        row = self._db.execute(
            "SELECT id, kind, name, spec, created, status, host FROM campaigns WHERE id = ?",
            (int(campaign_id),)).fetchone()
        if row is None:
            ids = [r[0] for r in self._db.execute("SELECT id FROM campaigns ORDER BY id")]
            held = f"its campaigns: {_id_ranges(ids)}" if ids else "it holds none"
            raise UserError(f"no campaign {campaign_id} in {self.path} ({held})")
        return Campaign(row[0], row[1], row[2], json.loads(row[3]), row[4], row[5], row[6])

    def campaigns(self, kind: str | None = None) -> list[Campaign]:
        """All campaigns (optionally of one kind), oldest first."""
        sql = "SELECT id FROM campaigns" + (" WHERE kind = ?" if kind else "") + " ORDER BY id"
        return [self.campaign(r[0]) for r in self._db.execute(sql, (kind,) if kind else ())]

    def set_campaign_status(self, campaign_id: int, status: str) -> None:
        """Set a campaign's status (running, complete, stopped, interrupted, ...)."""
        with self._write() as db:
            db.execute("UPDATE campaigns SET status = ? WHERE id = ?", (status, int(campaign_id)))


    def update_campaign_spec(self, campaign_id: int, spec: dict[str, Any]) -> None:
        """Replace a campaign's spec (e.g. a resume that raises the requested total)."""
        with self._write() as db:
            db.execute("UPDATE campaigns SET spec = ? WHERE id = ?", (_json(spec), int(campaign_id)))

    # -- runs ----------------------------------------------------------------------------
    def record_run(self, campaign_id: int, result: RunResult, seq: int | None = None) -> int:
        """Store one finished run and its failure signature, committed before returning.

        `seq` defaults to one past the campaign's last run. Returns the run's row id.
        """
        outcome = Outcome(result.outcome)
        sig = signature_of(result)
        # first_seen/last_seen are when runs with the signature ran (not when they were
        # stored: a run imported from a spill file later keeps its own time)
        seen = _finite_or_zero(result.started_at) or time.time()
        with self._write() as db:
            if seq is None:
                seq = int(db.execute("SELECT coalesce(max(seq), 0) + 1 FROM runs WHERE campaign_id = ?",
                                     (int(campaign_id),)).fetchone()[0])
            sig_id = None
            if sig is not None:
                db.execute(
                    "INSERT INTO signatures (key, outcome, error_kind, target, variant, message,"
                    " first_seen, last_seen, count) VALUES (?,?,?,?,?,?,?,?,1)"
                    " ON CONFLICT(key) DO UPDATE SET count = count + 1,"
                    " first_seen = min(first_seen, excluded.first_seen), last_seen = max(last_seen, excluded.last_seen)",
                    (sig.key, sig.outcome, sig.error_kind, sig.target, sig.variant, sig.message, seen, seen))
                sig_id = int(db.execute("SELECT id FROM signatures WHERE key = ?", (sig.key,)).fetchone()[0])
            cur = db.execute(
                "INSERT INTO runs (campaign_id, seq, target, variant, params, outcome, reason, error_kind,"
                " evidence, metrics, started_at, duration_s, host, gpu_uuid, worker_age, artifact_dir,"
                " signature_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (int(campaign_id), int(seq), result.target or "", result.variant or "", _json(result.params),
                 outcome.value, result.reason or "", result.error_kind, _json(result.evidence),
                 _json(result.metrics), _finite_or_zero(result.started_at),
                 _finite_or_zero(result.duration_s),
                 result.host or HOST, result.gpu_uuid, int(result.worker_age or 0),
                 str(result.artifact_dir) if result.artifact_dir else None, sig_id))
            self._calibrate(db, result, outcome, seen)
            return int(cur.lastrowid)

    def _calibrate(self, db: sqlite3.Connection, result: RunResult, outcome: Outcome, now: float) -> None:
        """Add a clean run's progress gaps to its item's calibration, and a server's
        start-up time (evidence `startup_s`) to its target's (in the run's transaction)."""
        evidence = result.evidence if isinstance(result.evidence, dict) else {}
        progress = evidence.get("progress") if outcome is Outcome.CLEAN else None
        gaps = progress.get("gaps") if isinstance(progress, dict) else None
        if isinstance(gaps, dict) and gaps:
            key = item_key(result.target or "", result.variant or "")
            row = db.execute("SELECT gaps FROM progress_calibration WHERE item = ?", (key,)).fetchone()
            merged = json.loads(row[0]) if row else {}
            for k, n in gaps.items():
                if isinstance(n, int) and n > 0:
                    merged[str(k)] = int(merged.get(str(k), 0)) + n
            db.execute("INSERT INTO progress_calibration (item, runs, gaps, updated) VALUES (?, 1, ?, ?)"
                       " ON CONFLICT(item) DO UPDATE SET runs = runs + 1, gaps = excluded.gaps,"
                       " updated = excluded.updated", (key, _json(merged), now))
        startup = evidence.get("startup_s")
        if isinstance(startup, (int, float)) and math.isfinite(startup) and startup > 0 and outcome is not Outcome.ERROR:
            db.execute("INSERT INTO progress_calibration (item, startup_max_s, updated) VALUES (?, ?, ?)"
                       " ON CONFLICT(item) DO UPDATE SET startup_max_s = max(coalesce(startup_max_s, 0),"
                       " excluded.startup_max_s), updated = excluded.updated",
                       (item_key(result.target or ""), float(startup), now))

    def progress_calibration(self, key: str) -> dict[str, Any] | None:
        """An item's stored calibration ({runs, gaps, startup_max_s}), or None."""
        try:
            row = self._db.execute("SELECT runs, gaps, startup_max_s FROM progress_calibration WHERE item = ?",
                                   (key,)).fetchone()
        except sqlite3.OperationalError:  # a read-only store from before the table
            return None
        if row is None:
            return None
        return {"runs": int(row[0]), "gaps": json.loads(row[1]), "startup_max_s": row[2]}

    def runs(self, campaign_id: int | None = None, *, outcome: str | Outcome | None = None,
             target: str | None = None, variant: str | None = None) -> list[StoredRun]:
        """Stored runs matching the filters, in (campaign, seq) order."""
        return list(self.iter_runs(campaign_id, outcome=outcome, target=target, variant=variant))

    def iter_runs(self, campaign_id: int | None = None, *, outcome: str | Outcome | None = None,
                  target: str | None = None, variant: str | None = None) -> Iterator[StoredRun]:
        """Like `runs`, without loading them all at once."""
        where, args = _where(campaign_id=campaign_id, outcome=outcome, target=target, variant=variant)
        sql = ("SELECT id, campaign_id, seq, signature_id, target, variant, params, outcome, reason,"
               " error_kind, evidence, metrics, started_at, duration_s, host, gpu_uuid, worker_age,"
               " artifact_dir FROM runs" + where + " ORDER BY campaign_id, seq")
        for r in self._db.execute(sql, args):
            yield StoredRun(r[0], r[1], r[2], r[3], RunResult(
                outcome=Outcome(r[7]), reason=r[8], target=r[4], variant=r[5],
                params=json.loads(r[6]), evidence=json.loads(r[10]), metrics=json.loads(r[11]),
                started_at=r[12], duration_s=r[13], host=r[14], gpu_uuid=r[15], worker_age=r[16],
                artifact_dir=r[17], error_kind=r[9]))

    def run_count(self, campaign_id: int) -> int:
        """How many runs a campaign has stored."""
        return int(self._db.execute("SELECT count(*) FROM runs WHERE campaign_id = ?",
                                    (int(campaign_id),)).fetchone()[0])

    def last_seq(self, campaign_id: int) -> int:
        """The highest seq stored for a campaign (0 when it has none)."""
        return int(self._db.execute("SELECT coalesce(max(seq), 0) FROM runs WHERE campaign_id = ?",
                                    (int(campaign_id),)).fetchone()[0])

    def first_failure_seq(self, campaign_id: int) -> int | None:
        """The seq of a campaign's first hang, fault or mismatch (None when it has none)."""
        failures = tuple(o.value for o in OUTCOMES if o.is_failure)
        row = self._db.execute(
            f"SELECT min(seq) FROM runs WHERE campaign_id = ? AND outcome IN ({','.join('?' * len(failures))})",
            (int(campaign_id), *failures)).fetchone()
        return int(row[0]) if row[0] is not None else None

    def counts(self, campaign_id: int | None = None) -> dict[str, int]:
        """Outcome counts (all five outcomes present) for one campaign or the whole store."""
        where, args = _where(campaign_id=campaign_id)
        out = empty_counts()
        for outcome, c in self._db.execute(f"SELECT outcome, count(*) FROM runs{where} GROUP BY outcome", args):
            out[outcome] = int(c)
        return out

    def tally(self, campaign_id: int | None = None) -> list[Tally]:
        """Outcome counts per (target, variant), sorted by target then variant."""
        where, args = _where(campaign_id=campaign_id)
        tallies: dict[tuple[str, str], Tally] = {}
        for target, variant, outcome, c in self._db.execute(
                f"SELECT target, variant, outcome, count(*) FROM runs{where}"
                " GROUP BY target, variant, outcome ORDER BY target, variant", args):
            t = tallies.setdefault((target, variant), Tally(target, variant, empty_counts()))
            t.counts[outcome] = int(c)
        return list(tallies.values())

    def signatures(self, campaign_id: int | None = None) -> list[Signature]:
        """Failure signatures, most frequent first; counts restricted to a campaign if given."""
        where, args = _where(campaign_id=campaign_id, prefix="r.")
        rows = self._db.execute(
            "SELECT s.id, s.key, s.outcome, s.error_kind, s.target, s.variant, s.message,"
            " min(r.started_at), max(r.started_at), count(r.id)"
            " FROM signatures s JOIN runs r ON r.signature_id = s.id" + where +
            " GROUP BY s.id ORDER BY count(r.id) DESC, s.id", args)
        return [Signature(*row) for row in rows]

    def new_signatures(self, campaign_id: int) -> list[Signature]:
        """The campaign's failure signatures never seen before it in this store: no run of
        an earlier campaign (of any kind) has them. Counts and times are the campaign's."""
        rows = self._db.execute(
            "SELECT s.id, s.key, s.outcome, s.error_kind, s.target, s.variant, s.message,"
            " min(r.started_at), max(r.started_at), count(r.id)"
            " FROM signatures s JOIN runs r ON r.signature_id = s.id WHERE r.campaign_id = ?"
            " AND NOT EXISTS (SELECT 1 FROM runs e WHERE e.signature_id = s.id AND e.campaign_id < ?)"
            " GROUP BY s.id ORDER BY count(r.id) DESC, s.id", (int(campaign_id), int(campaign_id)))
        return [Signature(*row) for row in rows]

    def integrity_check(self) -> str:
        """SQLite's own check: 'ok' when the database file is sound."""
        return str(self._db.execute("PRAGMA integrity_check").fetchone()[0])


def _where(*, campaign_id: int | None = None, outcome: str | Outcome | None = None,
           target: str | None = None, variant: str | None = None, prefix: str = "") -> tuple[str, tuple]:
    clauses, args = [], []
    for col, val in (("campaign_id", campaign_id), ("outcome", outcome), ("target", target), ("variant", variant)):
        if val is not None:
            clauses.append(f"{prefix}{col} = ?")
            args.append(Outcome(val).value if col == "outcome" else val)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(args)


class _Txn:
    """`BEGIN IMMEDIATE` ... `COMMIT`: take the write lock up front (waits busy_timeout).
    A failed statement or COMMIT rolls back (SQLite may have done so already), so the
    connection is never left inside a transaction, and the first failure is the one raised."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            try:
                self.db.execute("COMMIT")
                return
            except BaseException:
                self._rollback()
                raise
        self._rollback()

    def _rollback(self) -> None:
        if self.db.in_transaction:
            try:
                self.db.execute("ROLLBACK")
            except (sqlite3.Error, StoreError):
                pass


def _read_spill(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of a spill file, and how many lines could not be read (a torn last line)."""
    records, bad = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if rec.get("format") != SPILL_FORMAT or "result" not in rec or "seq" not in rec:
                    raise ValueError("not a spill record")
                records.append(rec)
            except (ValueError, AttributeError):
                bad += 1
    return records, bad
