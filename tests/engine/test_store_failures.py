"""A results store that fails (damaged file, full disk) or sits on a read-only mount.

A store failure is one line naming the file and what to do, exit 4 (not 1: no hazard was
observed), and the finished run is kept in a spill file that the next writable open of the
store imports. `stats`, `report` and `compare` read a store on a read-only mount.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import REPO, hazards, sha256
from hazards.engine.campaign import LeasedCampaign
from hazards.engine.errors import EXIT_STORE, StoreError
from hazards.engine.loop import WorkItem
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.store import Store


@pytest.fixture(autouse=True)
def private_state(tmp_path, monkeypatch):
    """Spill files that cannot go beside the store go under this test's folder."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


BIG_FAILURE = "import os, sys; print(os.urandom(8000).hex()); print(os.urandom(8000).hex(), file=sys.stderr); sys.exit(1)"


def _big_failure() -> WorkItem:
    """A failing program whose output tails fill several database pages."""
    return WorkItem("fails", kind="command", argv=(sys.executable, "-c", BIG_FAILURE), timeout_s=30)


CORRUPT = """import os, sys
path = sys.argv[1]
with open(path, "r+b") as f:  # every page but the header page: random bytes (a damaged disk)
    for off in range(4096, os.path.getsize(path), 4096):
        f.seek(off)
        f.write(os.urandom(4096))
sys.exit(1)
"""


def _corrupting_item(path: Path) -> WorkItem:
    """A program that damages the store while it runs, then fails (exit 1: a mismatch)."""
    return WorkItem("corrupts", kind="command", argv=(sys.executable, "-c", CORRUPT, str(path)), timeout_s=30)


def _a_store_with_history(path: Path) -> int:
    with Store(path) as s:
        cid = s.create_campaign("run", {"argv": ["x"]})
        for i in range(30):
            s.record_run(cid, RunResult(Outcome.FAULT, f"fault {i}", target=f"t{i}", started_at=time.time()))
    return cid


def test_a_store_damaged_mid_campaign_stops_it_with_exit_4_and_keeps_the_run(tmp_path):
    """Before: sqlite3.DatabaseError escaped the loop as a traceback and the run was lost."""
    path = tmp_path / "results.db"
    _a_store_with_history(path)
    store = Store(path)
    frame = LeasedCampaign.on_cpu(store)
    cid = frame.create("run", {"argv": ["x"]})
    with frame, pytest.raises(StoreError) as e:
        frame.repeat(item=_corrupting_item(path), n=3, timeout=30, campaign_id=cid)
    store.close()
    msg = str(e.value)
    assert e.value.exit_code == EXIT_STORE == 4 and "\n" not in msg
    assert msg.startswith(f"results store {path}: database disk image is malformed")
    assert "the file is damaged: move it aside" in msg and f"--resume {cid}" in msg
    spill = path.with_name(path.name + ".spill.jsonl")
    assert f"kept in {spill}" in msg
    records = [json.loads(line) for line in spill.read_text().splitlines()]
    assert [(r["seq"], r["result"]["outcome"]) for r in records] == [(1, "mismatch")]
    # what the message says to do: move it aside; the next open imports the run
    path.rename(tmp_path / "results.db.damaged")
    for side in ("-wal", "-shm"):
        Path(str(path) + side).unlink(missing_ok=True)
    with Store(path) as fresh:
        (camp,) = fresh.campaigns()
        assert camp.status == "interrupted" and camp.spec["recovered_from"]["campaign"] == cid
        assert [(sr.seq, sr.result.outcome) for sr in fresh.runs(camp.id)] == [(1, Outcome.MISMATCH)]
    assert not spill.exists()


def test_a_full_disk_spills_every_finished_run_and_resume_imports_them(tmp_path):
    """SQLite's own SQLITE_FULL (the page limit stands in for the disk): exit 4 with what to
    do; both GPUs' runs in flight are kept and imported, in their campaign, by the next open."""
    path = tmp_path / "results.db"
    store = Store(path)
    frame = LeasedCampaign.on_cpu(store)
    cid = frame.create("run", {"argv": ["x"]})
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")
    with frame, pytest.raises(StoreError) as e:
        frame.repeat(item=_big_failure(), n=3, timeout=30, campaign_id=cid)
    store.close()
    assert "database or disk is full (SQLITE_FULL): the disk is full" in str(e.value)
    spill = path.with_name(path.name + ".spill.jsonl")
    assert spill.is_file()
    with Store(path) as s:  # a resume opens the store for writing first
        assert [sr.seq for sr in s.runs(cid)] == [1] and s.runs(cid)[0].result.reason
        assert s.campaign(cid).spec["argv"] == ["x"]
    assert not spill.exists()
    with Store(path) as s:  # importing twice adds nothing
        assert s.run_count(cid) == 1


def test_a_spill_that_cannot_go_beside_the_store_goes_to_the_state_folder(tmp_path):
    from hazards.engine.store import StoreLayout

    path = tmp_path / "db" / "results.db"
    with Store(path) as s:
        cid = s.create_campaign("run", {})
    (tmp_path / "db" / "results.db.spill.jsonl").mkdir()  # the first choice cannot be written
    with Store(path) as s:
        where = s.spill(cid, 7, RunResult(Outcome.HANG, "no reply", target="t"), s.campaign(cid))
    assert where == str(StoreLayout(path).spills[1]) and where.startswith(str(tmp_path / "state"))
    (tmp_path / "db" / "results.db.spill.jsonl").rmdir()
    with Store(path) as s:
        assert [(sr.seq, sr.result.outcome) for sr in s.runs(cid)] == [(7, Outcome.HANG)]
    assert not Path(where).exists()


def test_first_seen_of_a_signature_is_when_its_run_ran_not_when_it_was_stored(tmp_path):
    with Store(tmp_path / "r.db") as s:
        cid = s.create_campaign("run", {})
        s.record_run(cid, RunResult(Outcome.FAULT, "boom", target="t", started_at=2000.0))
        s.record_run(cid, RunResult(Outcome.FAULT, "boom", target="t", started_at=1000.0))  # imported late
        (first, last), = s._db.execute("SELECT first_seen, last_seen FROM signatures").fetchall()
        assert (first, last) == (1000.0, 2000.0)


# -- through the command line, on real mounts -----------------------------------------------------

def _in_namespace(script: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a shell script as root of a new user+mount namespace (mounts vanish with it)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    full = {k: v for k, v in os.environ.items() if k != "HZ_STORE"}
    full["PYTHONPATH"] = str(REPO) + os.pathsep + full.get("PYTHONPATH", "")
    full.update(env or {})
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user namespaces here: {probe.stderr.decode().strip()}")
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], cwd=cwd,
                          env=full, capture_output=True, text=True, timeout=300)


def test_a_full_disk_through_hazards_run_is_exit_4_and_resume_imports_the_run(tmp_path):
    """A real ENOSPC (a 1 MB tmpfs the program fills): one line naming the store and what to
    do, exit 4 (1 before: a traceback), the run spilled to the state folder (the disk that
    holds the store is full), imported by `--resume` once there is space again."""
    disk = tmp_path / "disk"
    disk.mkdir()
    fill = tmp_path / "fill.py"  # fills the disk (more than it holds), then exits 0
    fill.write_text(f"try:\n    open('{disk}/fill', 'wb').write(bytes(4 << 20))\nexcept OSError:\n    pass\n")
    py = sys.executable
    script = (f"mount -t tmpfs -o size=1m tmpfs {disk} && "
              f"{py} -m hazards run -n 3 --store {disk}/results.db -- {py} {fill}; echo rc=$?; "
              f"rm {disk}/fill; {py} -m hazards run --resume 1 -n 1 --json --store {disk}/results.db; "
              f"echo rc=$?")
    proc = _in_namespace(script, tmp_path, {"XDG_STATE_HOME": str(tmp_path / "state")})
    out = proc.stdout
    assert "rc=4" in out, (proc.stdout, proc.stderr)
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("hazards: error:")]
    assert len(err) == 1 and f"results store {disk}/results.db: database or disk is full" in err[0]
    assert "free space" in err[0] and str(tmp_path / "state") in err[0] and "--resume 1" in err[0]
    assert "Traceback" not in proc.stderr
    summary = json.loads(out.split("rc=4", 1)[1].strip().splitlines()[0])
    assert summary["n"] == 1 and summary["counts"]["clean"] == 1 and out.rstrip().endswith("rc=0")
    assert not list((tmp_path / "state").rglob("*.jsonl"))


@pytest.fixture
def two_campaigns(tmp_path):
    path = tmp_path / "ro" / "results.db"
    with Store(path) as s:
        for k in (3, 0):
            cid = s.create_campaign("run", {"argv": ["x"]})
            for i in range(10):
                s.record_run(cid, RunResult(Outcome.FAULT if i < k else Outcome.CLEAN, "x", target="t",
                                            started_at=time.time()))
            s.set_campaign_status(cid, "complete")
    return path


def test_stats_report_and_compare_read_a_store_on_a_read_only_mount(tmp_path, two_campaigns):
    """Before: 'attempt to write a readonly database' / 'unable to open database file'."""
    ro, db = two_campaigns.parent, two_campaigns
    digest = sha256(db)
    py = sys.executable
    script = (f"mount --bind -o ro {ro} {ro} && touch {ro}/x 2>/dev/null && echo WRITABLE; "
              f"{py} -m hazards stats --json --store {db}; echo rc=$?; "
              f"{py} -m hazards report 2 --json -o {tmp_path}/r.html --store {db}; echo rc=$?; "
              f"{py} -m hazards compare --before-campaign 1 --after-campaign 2 --json --store {db}; echo rc=$?")
    proc = _in_namespace(script, tmp_path)
    assert "WRITABLE" not in proc.stdout, "the bind mount was not read-only"
    lines = proc.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("rc=")] == ["rc=0", "rc=0", "rc=0"], (proc.stdout, proc.stderr)
    stats, report, cmp = (json.loads(ln) for ln in lines if ln.startswith("{"))
    assert stats["rows"][0]["n"] == 20 and stats["rows"][0]["failures"] == 3
    assert report["campaign"]["id"] == 2 and (tmp_path / "r.html").is_file()
    assert (cmp["k_before"], cmp["n_before"], cmp["k_after"], cmp["n_after"]) == (3, 10, 0, 10)
    assert sha256(db) == digest and sorted(p.name for p in ro.iterdir()) == ["results.db"]


def test_read_only_open_never_writes(two_campaigns):
    with Store(two_campaigns, read_only=True) as s, pytest.raises(StoreError, match="readonly"):
        s.create_campaign("run", {})
    assert sqlite3.connect(two_campaigns).execute("SELECT count(*) FROM campaigns").fetchone() == (2,)


def test_every_command_that_writes_a_read_only_store_says_so_with_exit_4(tmp_path, two_campaigns):
    """A store that exists but cannot be written is a store failure (exit 4, one line naming
    it), for every command that writes one; before, some said exit 2 ("not writable": bad
    input) and others exit 4. The commands that only read still work (the test above)."""
    ro, db = two_campaigns.parent, two_campaigns
    (tmp_path / "t.toml").write_text("[[target]]\nname = 'x'\nargv = ['true']\n")
    py = f"{sys.executable} -m hazards"
    commands = [f"run -n 1 --store {db} -- true", f"run --resume 1 --store {db}", f"repro -n 1 --store {db} -- true",
                f"soak --budget 1s --no-families --targets {tmp_path}/t.toml --store {db}",
                f"check --budget 1s --families pipeline --store {db}", f"stress pipeline -r 1 --store {db}",
                f"explore pipeline --budget 1s --store {db}", f"bisect --resume 1 --store {db}"]
    script = f"mount --bind -o ro {ro} {ro} && touch {ro}/x 2>/dev/null && echo WRITABLE; " + "".join(
        f"{py} {c} >/dev/null 2>{tmp_path}/err; echo \"rc=$? $(cat {tmp_path}/err | wc -l) $(head -c 300 {tmp_path}/err)\"; "
        for c in commands)
    proc = _in_namespace(script, tmp_path, env={"HZ_FAKE_GPUS": "0"})
    assert "WRITABLE" not in proc.stdout, "the bind mount was not read-only"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("rc=")]
    assert len(lines) == len(commands), proc.stdout + proc.stderr
    for command, line in zip(commands, lines):
        assert line.startswith("rc=4 1 hazards: error: results store ") and "read-only" in line, (command, line)
