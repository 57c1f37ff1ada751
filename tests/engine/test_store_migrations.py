"""Store migrations: a stored version-1 database (tests/data/store-v1.db) migrated forward
with a backup first; read-only opens of an old store say what to run; a newer store is
refused; `hazards store check|migrate`."""
from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from hazards.cli import main
from hazards.engine import store as store_mod
from hazards.engine.errors import StoreError, UserError
from hazards.engine.store import Migration, Store

V1 = Path(__file__).resolve().parent.parent / "data" / "store-v1.db"

# A schema change of the kind a real one is: a new table and a new column of an old one.
NEXT = Migration(to=store_mod.SCHEMA_VERSION + 1, what="the test's notes table and runs.note",
                 sql="CREATE TABLE hz_test_notes (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL "
                     "REFERENCES runs(id), note TEXT NOT NULL); ALTER TABLE runs ADD COLUMN note TEXT")


REAL_MIGRATIONS = store_mod.MIGRATIONS  # the code's own, before a test adds NEXT


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def schema(path: Path) -> set[tuple]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        return {(t, n, tb, " ".join((sql or "").split())) for t, n, tb, sql in rows}
    finally:
        db.close()


def user_version(path: Path) -> int:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


def backups(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if "-backup-" in p.name)


@pytest.fixture
def v1_store(tmp_path: Path) -> Path:
    """A copy of the stored version-1 database (the fixture itself is never opened for writing)."""
    path = tmp_path / "results.db"
    shutil.copyfile(V1, path)
    return path


@pytest.fixture
def next_migration(monkeypatch):
    """This hazards with one more migration than the code has: the next schema change."""
    monkeypatch.setattr(store_mod, "MIGRATIONS", (*store_mod.MIGRATIONS, NEXT))
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", NEXT.to)
    return NEXT


def test_the_v1_fixture_has_the_version_1_schema_the_code_still_creates_from(tmp_path):
    """_SCHEMA_V1 is never edited: a schema change is a migration."""
    assert user_version(V1) == 1
    made = tmp_path / "v1.db"
    db = sqlite3.connect(made)
    db.executescript(store_mod._SCHEMA_V1)
    db.close()
    assert schema(V1) == schema(made)


def test_the_v1_fixture_migrated_is_a_new_store_with_every_run_kept(v1_store, tmp_path):
    with Store(tmp_path / "new.db"):
        pass
    with Store(v1_store) as s:
        runs = s.runs()
        sigs = s.signatures()
    assert schema(v1_store) == schema(tmp_path / "new.db")
    assert user_version(v1_store) == store_mod.SCHEMA_VERSION
    assert len(runs) == 7 and {r.result.outcome.value for r in runs} == {"clean", "hang", "fault", "mismatch", "error"}
    assert {s.outcome for s in sigs} == {"hang", "fault", "mismatch", "error"}
    if store_mod.SCHEMA_VERSION == 1:
        assert backups(tmp_path) == []  # nothing to migrate: no backup


def test_a_writable_open_backs_the_old_store_up_then_migrates_it(v1_store, tmp_path, next_migration, caplog):
    original = schema(v1_store)
    with Store(tmp_path / "new.db"):
        pass
    with Store(v1_store) as s:
        assert s.migrated is not None and (s.migrated.from_version, s.migrated.to_version) == (1, NEXT.to)
        assert len(s.runs()) == 7
        cid = s.create_campaign("run", {})  # a migrated store takes new runs
        s.record_run(cid, s.runs()[0].result)
    assert user_version(v1_store) == NEXT.to
    assert schema(v1_store) == schema(tmp_path / "new.db")  # migrated == created at the new version
    assert "hz_test_notes" in {n for _, n, _, _ in schema(v1_store)}
    [backup] = backups(tmp_path)
    assert backup == s.migrated.backup and backup.name.startswith("results.db.v1-backup-")
    assert user_version(backup) == 1 and schema(backup) == original
    assert sqlite3.connect(backup).execute("SELECT count(*) FROM runs").fetchone()[0] == 7
    assert not list(tmp_path.glob("*.tmp-*"))
    assert "migrated results store" in caplog.text and str(backup) in caplog.text


def test_a_read_only_open_of_an_old_store_says_what_to_run_and_changes_nothing(v1_store, tmp_path, next_migration,
                                                                            capsys):
    before = sha(v1_store)
    with pytest.raises(UserError, match="schema version 1; this hazards reads version") as e:
        Store(v1_store, read_only=True)
    assert f"hazards store migrate --store {v1_store}" in str(e.value)
    for args in (["stats"], ["report", "-o", str(tmp_path / "r.html")], ["compare", "--before-campaign", "1",
                                                                        "--after", "0/3"]):
        assert main([*args, "--store", str(v1_store)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "hazards store migrate" in err, (args, err)
    assert sha(v1_store) == before and backups(tmp_path) == []


def test_a_newer_store_is_refused_in_one_line_by_every_open_and_never_changed(v1_store, tmp_path, capsys):
    db = sqlite3.connect(v1_store)
    db.execute(f"PRAGMA user_version = {store_mod.SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    before = sha(v1_store)
    for read_only in (False, True):
        with pytest.raises(UserError, match="newer than this hazards knows"):
            Store(v1_store, read_only=read_only)
    for args in (["store", "check"], ["store", "migrate"], ["stats"]):
        assert main([*args, "--store", str(v1_store)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "newer than this hazards knows" in err, (args, err)
    assert sha(v1_store) == before and backups(tmp_path) == []


def test_store_check_lists_the_missing_migrations_and_migrate_applies_them(v1_store, tmp_path, next_migration,
                                                                          capsys):
    assert main(["store", "check", "--store", str(v1_store)]) == 1
    out = capsys.readouterr().out
    assert f"schema version 1 (this hazards: {NEXT.to})" in out and NEXT.what in out
    assert f"hazards store migrate --store {v1_store}" in out and "integrity: ok" in out
    assert main(["store", "check", "--json", "--store", str(v1_store)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1
    assert doc["pending"] == [{"to": m.to, "what": m.what} for m in (*REAL_MIGRATIONS, NEXT)]

    assert main(["store", "migrate", "--store", str(v1_store)]) == 0
    captured = capsys.readouterr()
    [backup] = backups(tmp_path)
    assert f"from schema version 1 to {NEXT.to}" in captured.out and str(backup) in captured.out
    assert captured.err == ""  # said once, on stdout
    assert main(["store", "check", "--store", str(v1_store)]) == 0
    assert main(["store", "migrate", "--store", str(v1_store)]) == 0
    assert "nothing to migrate" in capsys.readouterr().out
    assert backups(tmp_path) == [backup]
    assert main(["stats", "--store", str(v1_store)]) == 0  # readers read it again


def test_store_check_says_damage_with_the_store_exit_code(v1_store, capsys):
    assert main(["store", "migrate", "--store", str(v1_store)]) == 0  # to this hazards' version
    assert main(["store", "check", "--store", str(v1_store)]) == 0
    capsys.readouterr()
    db = sqlite3.connect(v1_store)  # an index that no longer matches its table: damage SQLite finds
    db.execute("PRAGMA writable_schema = ON")
    db.execute("UPDATE sqlite_master SET sql = 'CREATE INDEX runs_by_target ON runs (variant, target)'"
               " WHERE name = 'runs_by_target'")
    db.commit()
    db.close()
    assert main(["store", "check", "--store", str(v1_store)]) == 4
    out = capsys.readouterr().out
    assert "integrity: " in out and "integrity: ok" not in out


def test_a_failing_migration_leaves_the_store_as_it_was(v1_store, tmp_path, monkeypatch):
    bad = Migration(to=NEXT.to, what="a step that fails half-way",
                    sql="CREATE TABLE hz_half (x); ALTER TABLE no_such_table ADD COLUMN y")
    monkeypatch.setattr(store_mod, "MIGRATIONS", (*store_mod.MIGRATIONS, bad))
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", bad.to)
    original = schema(v1_store)
    with pytest.raises(StoreError, match="failed in the step to version .*a step that fails half-way.*unchanged"):
        Store(v1_store)
    assert user_version(v1_store) == 1 and schema(v1_store) == original  # no hz_half: all or nothing
    [backup] = backups(tmp_path)
    assert user_version(backup) == 1


def test_no_migration_without_its_backup(v1_store, tmp_path, next_migration, monkeypatch):
    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_mod.os, "replace", full_disk)
    before = sha(v1_store)
    with pytest.raises(StoreError, match="could not back it up .*No space left on device.*not changed"):
        Store(v1_store)
    assert sha(v1_store) == before and user_version(v1_store) == 1
    assert list(tmp_path.iterdir()) == [v1_store]  # no partial backup left behind


def test_a_run_committed_between_the_backup_and_the_lock_is_in_the_retaken_backup(v1_store, tmp_path,
                                                                                 next_migration, monkeypatch):
    """The backup must hold every run the migrated store holds: another writer that commits
    after the copy was taken makes the migration take it again."""
    real_backup = store_mod._backup
    calls = []

    def backup_then_another_writer_commits(db, path, version):
        made = real_backup(db, path, version)
        calls.append(made)
        if len(calls) == 1:
            other = sqlite3.connect(path)
            other.execute("INSERT INTO campaigns (kind, spec, created, status, host) VALUES ('run', '{}', 0, 'x', 'h')")
            other.commit()
            other.close()
        return made

    monkeypatch.setattr(store_mod, "_backup", backup_then_another_writer_commits)
    with Store(v1_store) as s:
        backup = s.migrated.backup
    assert len(calls) == 2 and backups(tmp_path) == [backup]  # the stale first copy removed
    assert sqlite3.connect(backup).execute("SELECT count(*) FROM campaigns").fetchone()[0] == 3


def test_a_new_store_is_made_at_version_1_and_migrated_forward(tmp_path, next_migration):
    with Store(tmp_path / "new.db") as s:
        assert s.migrated is None  # nothing to keep: no backup
    assert user_version(tmp_path / "new.db") == NEXT.to
    assert "hz_test_notes" in {n for _, n, _, _ in schema(tmp_path / "new.db")}
    assert backups(tmp_path) == []


def test_store_check_and_migrate_agree_that_an_empty_file_is_no_store_yet(tmp_path, capsys):
    # `store check` said "needs 1 migration: run hazards store migrate", which then refused it.
    empty = tmp_path / "r.db"
    empty.write_bytes(b"")
    for command in (["store", "check"], ["store", "migrate"]):
        rc = main([*command, "--store", str(empty)])
        err = capsys.readouterr().err
        assert rc == 2 and "is an empty results store" in err and err.count("\n") == 1, (command, rc, err)
    assert empty.read_bytes() == b""


@pytest.mark.parametrize("args", [["store", "check"], ["store", "migrate"], ["stats"], ["report"], ["run", "-n", "1"]])
def test_a_folder_given_as_the_store_says_which_file_to_pass_in_every_command(tmp_path, capsys, args):
    # a reader once said "no results store at <folder>", a writer "is a directory": one sentence,
    # naming the store file inside the folder
    folder = tmp_path / ".hazards"
    folder.mkdir()
    cmd = [*args, "--store", str(folder)] + (["--", "true"] if args[0] == "run" else [])
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert f"store path {folder} is a folder; give the database file, such as {folder / 'results.db'}" in err, err
    assert err.count("\n") == 1 and not (folder / "results.db").exists()
