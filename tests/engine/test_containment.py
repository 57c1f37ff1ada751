"""Nothing outlives its supervisor: children get a parent-death signal,
every child has a cgroup of its own where the machine delegates cgroup v2, the `hazards`
command is a child subreaper with a guardian, stop signals end every command like Ctrl-C,
and the next start cleans up after a supervisor that died and marks its campaign."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from cli_helpers import REPO
from engine_fakes import FAKES, fake_command, recorded_pids, running
from hazards.engine.containment import CONTAINMENT
from hazards.engine.outcome import Outcome
from hazards.engine.targets import CommandTarget

HAS_CGROUP = CONTAINMENT.describe()["cgroup"].startswith("/")
needs_cgroup = pytest.mark.skipif(not HAS_CGROUP, reason=f"no delegated cgroup v2 here: {CONTAINMENT.describe()['cgroup']}")


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _kill_left(pids: set[int]) -> None:
    """A failed test must not leave its fakes behind."""
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def env(tmp_path, pidfile):
    """The environment of a `hazards` process under test: its own runtime folder and store."""
    e = {k: v for k, v in os.environ.items() if k not in ("HZ_STORE", "HZ_FAKE_GPUS", "CUDA_VISIBLE_DEVICES")}
    e.update(PYTHONPATH=str(REPO), HZ_RUNTIME_DIR=str(tmp_path / "runtime"), HZ_FAKE_PIDFILE=str(pidfile),
             HZ_LEASE_DIR=str(tmp_path / "leases"))
    return e


def _hazards(args: list[str], env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hazards", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _campaign(db: Path) -> tuple[int, str, dict]:
    con = sqlite3.connect(db)
    try:
        cid, status, spec = con.execute("SELECT id, status, spec FROM campaigns ORDER BY id DESC").fetchone()
    finally:
        con.close()
    return cid, status, json.loads(spec)


# -- one run ------------------------------------------------------------------------------

@needs_cgroup
def test_a_daemon_that_escaped_group_marker_and_pipes_dies_with_its_cgroup(fake_env, pidfile):
    result = CommandTarget(fake_command("daemonize"), env=fake_env, grace_s=0.3).run(timeout=2)
    pids = recorded_pids(pidfile)
    try:
        assert result.outcome is Outcome.HANG and len(pids) == 2, pids
        assert result.evidence["cgroup"].startswith(CONTAINMENT.cgroup_root)
        assert set(result.evidence["killed"]) == pids and result.evidence["survivors"] == []
        assert not any(running(p) for p in pids)
        assert not Path(result.evidence["cgroup"]).exists()  # the emptied cgroup is removed
    finally:
        _kill_left(pids)


def test_every_run_says_how_its_children_are_contained():
    info = CONTAINMENT.describe()
    assert set(info) == {"pdeathsig", "cgroup", "subreaper", "guardian", "record"}
    assert info["pdeathsig"].startswith(("setpriv", "pre-exec"))  # Linux always has one of them


def test_a_program_that_cannot_be_executed_is_an_error_run_not_a_fault(tmp_path):
    interpreter = tmp_path / "interpreter"
    shutil.copy("/bin/sh", interpreter)
    script = tmp_path / "orphaned-script"
    script.write_text(f"#!{interpreter}\n")
    script.chmod(0o755)
    target = CommandTarget([str(script)])  # checked here: the interpreter is there
    interpreter.unlink()  # then gone: exec fails behind the parent-death wrapper
    result = target.run(timeout=10)
    assert result.outcome is Outcome.ERROR and result.error_kind == "target_start", result.reason
    assert result.reason.startswith(f"cannot start {script}") and "No such file" in result.reason


# -- a library supervisor (no guardian) --------------------------------------------------------

LIBRARY_SUPERVISOR = textwrap.dedent("""
    import sys, threading
    from hazards.engine.campaign import LeasedCampaign
    from hazards.engine.loop import WorkItem
    from hazards.engine.store import Store
    from hazards.engine.tripwire.session import TripwireFile
    store = Store(sys.argv[1])
    tw = TripwireFile()
    print(tw.path, flush=True)
    argv = sys.argv[2:]
    item = WorkItem("blocker", kind="command", argv=tuple(argv), timeout_s=120)
    spec = {"argv": argv, "n": 3, "timeout": 120, "until_fail": False}  # what `hazards run` stores
    with LeasedCampaign.on_cpu(store) as frame:
        frame.repeat(item=item, n=3, timeout=120, kind="run", spec=spec)
""")


def test_a_dead_library_supervisors_children_die_and_the_next_start_cleans_the_rest(tmp_path, env, pidfile):
    db = tmp_path / "r.db"
    # No cgroup: any supervisor starting meanwhile would sweep a dead one's cgroup (and its
    # processes) before our next start could; here the record's process group must do.
    sup = subprocess.Popen([sys.executable, "-c", LIBRARY_SUPERVISOR, str(db), *fake_command("block_with_child")],
                           cwd=tmp_path, env={**env, "HZ_CGROUP": "off"}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    pids: set[int] = set()
    try:
        tripwire = Path(sup.stdout.readline().strip())
        _wait_for(lambda: len(recorded_pids(pidfile)) == 2, 30, "the program and its child")
        pids = recorded_pids(pidfile)
        program = min(pids)
        sup.kill()
        sup.communicate()
        # the parent-death signal: the program dies with its supervisor, at once
        _wait_for(lambda: not running(program), 2, "the program to die with its supervisor")
        (child,) = pids - {program}
        assert running(child) and tripwire.exists()  # no guardian in a library: left to the next start
        cid, status, _ = _campaign(db)
        assert status == "running"
        resumed = _hazards(["run", "--resume", str(cid), "-n", "1", "--timeout", "1", "--store", str(db)], env, tmp_path)
        _, err = resumed.communicate(timeout=120)
        assert f"campaign {cid} was interrupted: its supervisor pid {sup.pid} died; the next start killed" in err, err
        assert str(child) in err and str(tripwire) in err
        assert not running(child) and not tripwire.exists()
        _, status, spec = _campaign(db)
        assert spec["recovered_before"][0]["processes"] == [child]
        assert not list((tmp_path / "runtime" / "supervisors").iterdir())  # records done with are deleted
    finally:
        if sup.poll() is None:
            sup.kill()
        _kill_left(pids | recorded_pids(pidfile))


THREAD_SPAWNER = textwrap.dedent("""
    import sys, threading, time
    from hazards.engine.watchdog import Supervised
    children = []
    worker = threading.Thread(target=lambda: children.append(Supervised(sys.argv[1:], env=dict(__import__('os').environ))))
    worker.start(); worker.join()  # the thread that started the child is gone
    print(children[0].pid, flush=True)
    time.sleep(120)
""")


def test_a_child_started_from_a_thread_outlives_the_thread_but_not_the_process(tmp_path, env):
    sup = subprocess.Popen([sys.executable, "-c", THREAD_SPAWNER, sys.executable, str(FAKES / "sleeper.py")],
                           env=env, stdout=subprocess.PIPE, text=True)
    child = int(sup.stdout.readline())
    try:
        time.sleep(0.5)
        assert running(child)  # a parent-death signal tied to the exited thread would have fired
        sup.kill()
        sup.communicate()
        _wait_for(lambda: not running(child), 2, "the child to die with its supervisor")
    finally:
        _kill_left({child})


# -- the hazards command ---------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["block_with_child", "setsid_grandchild_noenv"]
                         + (["daemonize"] if HAS_CGROUP else []))
def test_sigkill_of_hazards_run_leaves_nothing_running(tmp_path, env, pidfile, mode):
    db = tmp_path / "r.db"
    proc = _hazards(["run", "-n", "3", "--timeout", "120", "--store", str(db), "--", *fake_command(mode)], env, tmp_path)
    pids: set[int] = set()
    try:
        _wait_for(lambda: len(recorded_pids(pidfile)) >= 2, 30, "the fake's processes")
        time.sleep(0.3)  # the escaping ones have left their group by now
        pids = recorded_pids(pidfile)
        proc.kill()
        proc.communicate()
        _wait_for(lambda: not any(running(p) for p in pids), 5, f"every process of {sorted(pids)} to die")
        (record,) = (tmp_path / "runtime" / "supervisors").iterdir()  # kept: its campaign is unmarked

        def cleaned() -> list[dict]:
            return [json.loads(ln)["cleaned"] for ln in record.read_text().splitlines() if '"cleaned"' in ln]
        _wait_for(cleaned, 5, "the guardian's report")
        assert cleaned()[0]["by"] == "guardian"
        resumed = _hazards(["run", "--resume", "1", "-n", "1", "--timeout", "1", "--store", str(db)], env, tmp_path)
        _, err = resumed.communicate(timeout=150)
        assert "campaign 1 was interrupted" in err and "its guardian" in err, err
    finally:
        _kill_left(pids | recorded_pids(pidfile))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_a_stop_signal_ends_hazards_run_like_ctrl_c(tmp_path, env, pidfile, sig):
    db = tmp_path / "r.db"
    proc = _hazards(["run", "-n", "3", "--timeout", "120", "--store", str(db), "--",
                     *fake_command("block_with_child")], env, tmp_path)
    pids: set[int] = set()
    try:
        _wait_for(lambda: len(recorded_pids(pidfile)) == 2, 30, "the fake's processes")
        pids = recorded_pids(pidfile)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + sig, err
        assert "interrupted" in err and "Traceback" not in err
        assert not any(running(p) for p in pids)
        assert _campaign(db)[1] == "interrupted"
    finally:
        _kill_left(pids | recorded_pids(pidfile))


SOAK_TARGETS = """
[[target]]
name = "blocker"
argv = {argv}
timeout = 120
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_a_soak_on_two_gpus_at_once(tmp_path, env, pidfile, sig):
    targets = tmp_path / "targets.toml"
    targets.write_text(SOAK_TARGETS.format(argv=json.dumps(fake_command("block_with_child"))))
    db = tmp_path / "r.db"
    proc = _hazards(["soak", "--budget", "10m", "--targets", str(targets), "--no-families", "--store", str(db)],
                    {**env, "HZ_FAKE_GPUS": "0,1"}, tmp_path)
    pids: set[int] = set()
    try:
        _wait_for(lambda: len(recorded_pids(pidfile)) == 4, 60, "a blocker on each GPU")
        pids = recorded_pids(pidfile)
        t0 = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig, err
        assert time.monotonic() - t0 < 15  # the runs in flight were stopped, not waited for (120 s)
        assert not any(running(p) for p in pids)
        cid, status, _ = _campaign(db)
        assert status == "interrupted"
        con = sqlite3.connect(db)
        assert con.execute("SELECT count(*) FROM runs WHERE campaign_id = ?", (cid,)).fetchone()[0] == 0
        con.close()
    finally:
        _kill_left(pids | recorded_pids(pidfile))


# -- cleaning up after a dead supervisor, piece by piece -----------------------------------------

def _sleeper(env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(FAKES / "sleeper.py")], start_new_session=True,
                            env=env or dict(os.environ))


def test_the_next_start_kills_a_dead_supervisors_recorded_groups_and_removes_its_files(tmp_path, monkeypatch):
    from hazards.engine.proctree import start_ticks
    from hazards.engine.recovery import recover

    monkeypatch.setenv("HZ_RUNTIME_DIR", str(tmp_path / "rt"))
    left = _sleeper()                                                  # its child, in its own group
    marked = _sleeper(dict(os.environ, HZ_SUPERVISED_deadbeef="1"))     # left its group, kept the marker
    unrelated = _sleeper()                                             # a recycled pid: not to be touched
    tripwire = tmp_path / "hz-tw-dead"
    tripwire.write_bytes(b"x")
    elsewhere = tmp_path / "elsewhere.db"  # another store, still there: its campaign waits for it
    elsewhere.touch()
    try:
        _wait_for(lambda: all(start_ticks(p.pid) for p in (left, marked, unrelated)), 10, "the sleepers")
        folder = tmp_path / "rt" / "supervisors"
        folder.mkdir(parents=True)
        lines = [{"supervisor": {"pid": 999999, "ticks": 1, "boot_id": "", "argv": ["hazards", "run"]}},
                 {"child": {"pid": left.pid, "pgid": left.pid, "ticks": start_ticks(left.pid),
                            "mark": "HZ_SUPERVISED_deadbeef=", "cgroup": None}},
                 {"child": {"pid": unrelated.pid, "pgid": unrelated.pid, "ticks": 12345, "mark": "", "cgroup": None}},
                 {"file": str(tripwire)},
                 {"campaign": {"store": str(elsewhere), "id": 4}}]
        record = folder / "999999-1.jsonl"
        record.write_text("".join(json.dumps(x) + "\n" for x in lines))
        assert recover() == []  # no campaign of ours: reports are per store
        for proc in (left, marked):
            proc.wait(timeout=5)
        assert unrelated.poll() is None and not tripwire.exists()
        report = json.loads(record.read_text().splitlines()[-1])["cleaned"]
        assert sorted(report["processes"]) == sorted([left.pid, marked.pid]) and report["files"] == [str(tripwire)]
        marks = []
        assert recover(str(elsewhere), lambda cid, rep: marks.append((cid, rep)) or True) == [report]
        assert marks == [(4, report)] and not record.exists()  # every campaign marked: the record goes
    finally:
        for proc in (left, marked, unrelated):
            proc.kill()
            proc.wait()


@needs_cgroup
def test_cgroup_folders_of_dead_supervisors_are_swept_with_what_is_in_them():
    from hazards.engine.proctree import remove_cgroup
    from hazards.engine.recovery import cgroup_root_name, sweep_cgroups

    # A parent of this test's own, inside our cgroup root: the folder shared by every
    # supervisor of the machine is swept by each one that starts (another xdist worker's
    # `hazards` would sweep the stale folder first).
    parent = Path(CONTAINMENT.cgroup_root) / f"sweep-{uuid.uuid4().hex[:8]}"
    stale, alive = parent / "hazards-999999-1", parent / cgroup_root_name()
    (stale / "run-1").mkdir(parents=True)
    alive.mkdir()
    inside = _sleeper()
    try:
        (stale / "run-1" / "cgroup.procs").write_text(str(inside.pid))
        assert sweep_cgroups(parent) == [str(stale)]
        inside.wait(timeout=5)
        assert not stale.exists() and alive.exists()  # a supervisor alive (this one): kept
    finally:
        inside.kill()
        inside.wait()
        for folder in (stale / "run-1", stale, alive, parent):
            remove_cgroup(str(folder), wait_s=5)


def test_a_campaign_whose_supervisor_died_without_a_record_is_marked_at_the_next_start(tmp_path, monkeypatch):
    from hazards.engine.campaign import LeasedCampaign
    from hazards.engine.recovery import boot_id
    from hazards.engine.store import Store

    monkeypatch.setenv("HZ_RUNTIME_DIR", str(tmp_path / "rt"))
    with Store(tmp_path / "r.db") as store:
        dead = {"pid": 999999, "ticks": 1, "boot_id": boot_id(), "host": os.uname().nodename}
        gone = store.create_campaign("run", {"sessions": [{"supervisor": dead}]})
        said: list[str] = []
        with LeasedCampaign.on_cpu(store) as frame:
            frame.say = said.append
            live = frame.create("run", {})
            assert store.campaign(gone).status == "interrupted" and store.campaign(live).status == "running"
            frame.reopen(gone, "run")
        assert said == [f"campaign {gone} was interrupted: its supervisor pid 999999 died; no record of what it "
                        "ran was left (runtime folder cleared, or the machine rebooted)"]


def test_a_cgroup_folder_swept_by_another_supervisor_meanwhile_counts_as_removed(tmp_path, monkeypatch):
    """Two supervisors starting at once (two xdist workers) sweep the same dead folder: the
    one that finds it gone mid-sweep must not fail its own start (it raised FileNotFoundError)."""
    from hazards.engine import recovery
    stale = tmp_path / "hazards-1-1"
    stale.mkdir()
    monkeypatch.setattr(recovery, "kill_cgroup", lambda path: os.rmdir(path))  # the other sweeper wins
    assert recovery._remove_tree(str(stale)) is True


STARTING_SUPERVISOR = textwrap.dedent("""
    import json, sys
    from hazards.engine.containment import CONTAINMENT
    print("ready", flush=True)
    sys.stdin.readline()  # every one imported: start together
    print(json.dumps(CONTAINMENT.describe()), flush=True)
    sys.stdin.readline()
""")


STALE, STARTING = 30, 4  # many folders to sweep: the sweeps overlap


@needs_cgroup
def test_supervisors_starting_at_the_same_moment_each_get_a_cgroup_and_sweep_the_dead_ones(tmp_path):
    parent = Path(CONTAINMENT.cgroup_root).parent  # the folder every supervisor here sweeps
    stale = [parent / f"hazards-999999-{uuid.uuid4().int % 10**9}" for _ in range(STALE)]
    for folder in stale:
        for run in range(1, 4):
            (folder / f"run-{run}").mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), HZ_RUNTIME_DIR=str(tmp_path / "runtime"))
    sups = [subprocess.Popen([sys.executable, "-c", STARTING_SUPERVISOR], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(STARTING)]
    try:
        for sup in sups:
            assert sup.stdout.readline() == "ready\n", sup.communicate(timeout=60)[1]
        for sup in sups:
            sup.stdin.write("go\n")
            sup.stdin.flush()
        roots = []
        for sup in sups:
            line = sup.stdout.readline()
            assert line, sup.communicate(timeout=60)[1]
            roots.append(json.loads(line)["cgroup"])
        assert all(r.startswith(str(parent / "hazards-")) for r in roots) and len(set(roots)) == STARTING, roots
        assert not any(folder.exists() for folder in stale)  # swept, whichever supervisor got there first
        for sup in sups:
            sup.communicate("bye\n", timeout=60)
            assert sup.returncode == 0
        assert not any(Path(r).exists() for r in roots)  # each removed its own at exit
    finally:
        for sup in sups:
            if sup.poll() is None:
                sup.kill()
                sup.wait()


def test_the_supervisor_record_stays_proportional_to_what_is_live(tmp_path, monkeypatch):
    """A long campaign starts and ends a child per run: its record (~200 bytes a run) grew
    without bound (2.2 MB after 10,950 runs). It is rewritten in place, its live entries only,
    once it is large and mostly ended entries: the same state, the same file and lock."""
    import fcntl

    from hazards.engine.recovery import COMPACT_BYTES, SupervisorRecord, read_record

    monkeypatch.setenv("HZ_RUNTIME_DIR", str(tmp_path / "rt"))
    rec = SupervisorRecord.open()
    inode = os.stat(rec.path).st_ino
    rec.cgroup_root("/sys/fs/cgroup/hz-test")
    rec.file("/dev/shm/hz-tw-test")
    rec.campaign("/tmp/store.db", 3)
    rec.child(10, 10, 5, "HZ_SUPERVISED_x=1", None)  # lives throughout
    largest = 0
    for pid in range(1000, 12000):
        rec.child(pid, pid, 7, "HZ_SUPERVISED_x=1", None)
        if pid % 2:
            rec.file(f"/dev/shm/hz-tw-{pid}")
            rec.file_end(f"/dev/shm/hz-tw-{pid}")
        rec.child_end(pid)
        largest = max(largest, os.path.getsize(rec.path))
    rec.child(20, 20, 6, "HZ_SUPERVISED_x=1", None)  # started after the last rewrite
    assert largest <= COMPACT_BYTES + 1024, largest
    state = read_record(rec.path)
    assert sorted(state["children"]) == [10, 20] and state["files"] == ["/dev/shm/hz-tw-test"]
    assert state["cgroup_roots"] == ["/sys/fs/cgroup/hz-test"] and state["campaigns"] == [{"store": "/tmp/store.db", "id": 3}]
    assert state["supervisor"]["pid"] == os.getpid()
    assert os.stat(rec.path).st_ino == inode  # the guardian waits on this file: never replaced
    probe = os.open(rec.path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # still locked by its supervisor
    finally:
        os.close(probe)
    rec.child_end(10)
    rec.child_end(20)
    rec.file_end("/dev/shm/hz-tw-test")
    rec.cgroup_root_end("/sys/fs/cgroup/hz-test")
    rec.campaign_end("/tmp/store.db", 3)
    rec.close()
    assert not rec.path.exists()  # nothing left to clean: deleted as before


def test_a_death_between_the_rewrite_and_the_cut_leaves_the_same_state(tmp_path, monkeypatch):
    """The rewrite writes the live entries over the record's start, then cuts the file: a
    supervisor killed in between leaves them followed by the old log's tail, which must
    replay to the same children, files and campaigns."""
    from hazards.engine import recovery

    monkeypatch.setenv("HZ_RUNTIME_DIR", str(tmp_path / "rt"))
    monkeypatch.setattr(recovery, "COMPACT_BYTES", 1 << 40)  # no rewrite: the whole log kept
    rec = recovery.SupervisorRecord.open()
    rec.file("/dev/shm/hz-tw-live")
    for pid in range(1000, 1400):
        rec.child(pid, pid, 7, "HZ_SUPERVISED_x=1", None)
        if pid % 3 == 0:
            rec.campaign("/tmp/s.db", pid)
        if pid % 7:
            rec.child_end(pid)
    log = rec.path.read_bytes()
    snapshot = rec._head + b"".join(rec._live.values())
    assert len(snapshot) < len(log)
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(snapshot + log[len(snapshot):])
    assert recovery.read_record(torn) == recovery.read_record(rec.path)
    rec.close()


def test_kill_and_reap_reaps_its_process_and_gives_up_on_one_the_kernel_cannot_finish(monkeypatch):
    import subprocess

    from hazards.engine import proctree

    proc = subprocess.Popen(["sleep", "30"])
    proctree.kill_and_reap(proc)
    assert proc.returncode == -9  # reaped: no zombie left
    stuck = subprocess.Popen(["sleep", "30"])
    waits = []
    # a process in D state (inside a driver after an Xid) never finishes: the wait is bounded
    monkeypatch.setattr(stuck, "wait", lambda timeout=None: waits.append(timeout) or (_ for _ in ()).throw(
        subprocess.TimeoutExpired("sleep", timeout)))
    proctree.kill_and_reap(stuck)
    assert waits == [proctree.KILL_WAIT_S]
    monkeypatch.undo()
    stuck.wait()

