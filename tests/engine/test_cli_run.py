"""`hazards run`, `stats`, `compare` through the real entry point (`python3 -m hazards`)."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from cli_helpers import REPO, hazards
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.store import Store

FAKE = [sys.executable, str(REPO / "tests" / "fakes" / "fake_command.py")]


def run_json(tmp_path, *args):
    proc = hazards("run", "--json", "--store", str(tmp_path / "r.db"), *args, cwd=tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(proc.stdout)


def test_run_all_clean_exits_0_and_prints_one_json_object(tmp_path):
    proc, out = run_json(tmp_path, "-n", "3", "--timeout", "20", "--", *FAKE, "pass")
    assert proc.returncode == 0
    assert out["counts"] == {"clean": 3, "hang": 0, "fault": 0, "mismatch": 0, "error": 0}
    assert isinstance(out["campaign"], int) and out["rate"] == 0.0
    assert out["ci"][0] == 0.0 and out["upper_one_sided"] == pytest.approx(1 - 0.05 ** (1 / 3))
    db = sqlite3.connect(tmp_path / "r.db")
    assert db.execute("SELECT count(*), min(seq), max(seq) FROM runs WHERE campaign_id = ?",
                      (out["campaign"],)).fetchone() == (3, 1, 3)


def test_run_with_failures_exits_1_and_counts_them(tmp_path):
    proc, out = run_json(tmp_path, "-n", "2", "--timeout", "20", "--", *FAKE, "wrong_result")
    assert proc.returncode == 1
    assert out["counts"]["mismatch"] == 2 and out["failures"] == 2
    assert out["signatures"][0]["count"] == 2


def test_run_with_only_infrastructure_errors_exits_3(tmp_path):
    proc, out = run_json(tmp_path, "-n", "2", "--timeout", "20", "--", *FAKE, "exit", "2")
    assert out["counts"]["error"] == 2 and out["failures"] == 0
    assert proc.returncode == 3


def test_hang_is_counted_within_the_timeout(tmp_path):
    t0 = time.monotonic()
    proc, out = run_json(tmp_path, "-n", "1", "--timeout", "1", "--", *FAKE, "busy")
    assert out["counts"]["hang"] == 1 and proc.returncode == 1
    assert time.monotonic() - t0 < 45  # "busy" never ends: any bound catches a missed timeout; 15 s failed at load 17


def test_until_fail_stops_at_the_first_failure(tmp_path):
    # fails on its 3rd invocation: a counter file in the working directory
    script = tmp_path / "third_fails.py"
    script.write_text("import pathlib,sys\np=pathlib.Path('count')\n"
                      "n=int(p.read_text())+1 if p.exists() else 1\np.write_text(str(n))\nsys.exit(1 if n==3 else 0)\n")
    proc, out = run_json(tmp_path, "--until-fail", "--timeout", "20", "--", sys.executable, str(script))
    assert proc.returncode == 1
    assert out["n"] == 3 and out["first_failure_seq"] == 3 and out["status"] == "stopped"
    assert out["counts"]["mismatch"] == 1 and out["counts"]["clean"] == 2


def test_human_summary_gives_the_rate_in_words(tmp_path):
    proc = hazards("run", "-n", "2", "--store", str(tmp_path / "r.db"), "--", "true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "0 failures in 2 runs: rate ≤ 78% (95% upper bound)" in proc.stdout
    assert "campaign 1" in proc.stdout
    assert "clean 2" in proc.stderr  # the progress bar's final state


def test_resume_continues_a_campaign_to_a_new_total(tmp_path):
    _, first = run_json(tmp_path, "-n", "2", "--name", "demo", "--", "true")
    proc, out = run_json(tmp_path, "--resume", str(first["campaign"]), "-n", "5")
    assert proc.returncode == 0 and out["campaign"] == first["campaign"]
    assert out["n"] == 5 and out["ran_now"] == 3 and out["target"] == "demo"
    db = sqlite3.connect(tmp_path / "r.db")
    seqs = [r[0] for r in db.execute("SELECT seq FROM runs ORDER BY seq")]
    assert seqs == [1, 2, 3, 4, 5]
    # a finished campaign resumed without -n runs nothing more
    proc, out = run_json(tmp_path, "--resume", str(first["campaign"]))
    assert out["ran_now"] == 0 and out["n"] == 5


def _store_with(tmp_path, campaigns: dict[str, list[str]]) -> list[int]:
    """A store holding one campaign per name with the given outcomes (target = name)."""
    with Store(tmp_path / "r.db") as store:
        ids = []
        for name, outcomes in campaigns.items():
            cid = store.create_campaign("run", {"argv": ["true"]}, name=name)
            for o in outcomes:
                store.record_run(cid, RunResult(outcome=Outcome(o), reason=o, target=name))
            ids.append(cid)
    return ids


def test_stats_reports_rates_per_target(tmp_path):
    _store_with(tmp_path, {"good": ["clean", "clean"], "bad": ["mismatch"] * 3 + ["error"]})
    proc = hazards("stats", "--json", "--store", str(tmp_path / "r.db"), cwd=tmp_path)
    rows = {r["target"]: r for r in json.loads(proc.stdout)["rows"]}
    assert rows["good"]["n"] == 2 and rows["good"]["rate"] == 0.0
    assert rows["good"]["upper_one_sided"] == pytest.approx(1 - 0.05 ** 0.5)
    assert rows["bad"]["counts"]["mismatch"] == 3 and rows["bad"]["n"] == 4
    assert rows["bad"]["rate"] == 1.0  # the error run is not judged
    assert rows["bad"]["ci"] == pytest.approx([0.025 ** (1 / 3), 1.0])  # Clopper-Pearson for 3/3
    proc = hazards("stats", "--campaign", "1", "--store", str(tmp_path / "r.db"), cwd=tmp_path)
    assert proc.returncode == 0 and "good" in proc.stdout and "bad" not in proc.stdout
    assert "≤ 78%" in proc.stdout


def test_compare_in_words_and_json():
    proc = hazards("compare", "--before", "4/7", "--after", "0/10", cwd=REPO)
    assert proc.returncode == 0
    assert ("rate dropped (p=0.015); after-rate ≤ 26% (95% upper bound): not yet evidence of a fix, "
            "299 clean runs bound it below 1%") in proc.stdout
    out = json.loads(hazards("compare", "--before", "4/7", "--after", "0/10", "--json", cwd=REPO).stdout)
    assert out["fisher_p_one_sided"] == pytest.approx(0.0147, abs=5e-5)
    assert out["after_upper_95"] == pytest.approx(0.2589, abs=5e-4)
    assert out["runs_needed_1pct"] == 299
    assert 0 < out["boschloo_p"] <= out["fisher_p_one_sided"]
    assert out["verdict"].startswith("rate dropped")


def test_compare_two_stored_campaigns(tmp_path):
    before, after = _store_with(tmp_path, {"before": ["hang"] * 3, "after": ["clean"] * 4 + ["error"]})
    proc = hazards("compare", "--before-campaign", str(before), "--after-campaign",
                   str(after), "--json", "--store", str(tmp_path / "r.db"), cwd=tmp_path)
    out = json.loads(proc.stdout)
    assert (out["k_before"], out["n_before"], out["k_after"], out["n_after"]) == (3, 3, 0, 4)
    assert out["fisher_p_one_sided"] == pytest.approx(1 / 35)  # C(3,3)C(4,0)/C(7,3)


def _wait_for_runs(db_path, at_least, proc, deadline_s=60):
    t_end = time.monotonic() + deadline_s
    while time.monotonic() < t_end:
        assert proc.poll() is None, "hazards run ended before it could be killed"
        if db_path.exists():
            try:
                db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
                n = db.execute("SELECT count(*) FROM runs").fetchone()[0]
                db.close()
                if n >= at_least:
                    return n
            except sqlite3.OperationalError:
                pass  # schema not created yet
        time.sleep(0.05)
    raise AssertionError(f"fewer than {at_least} runs stored within {deadline_s} s")


def _signal_after_runs(args, db_path, signum, cwd, env, timeout_s):
    """Start `hazards ARGS`, send it `signum` once its store holds 3 runs, and return its
    exit status and stderr (it is killed if it outlives `timeout_s`)."""
    # Started as from an interactive terminal, whatever this worker inherited or an earlier test
    # left: a child started with SIGINT ignored keeps it ignored (Python installs no handler),
    # and then Ctrl-C is not what this test measures (a suite run once timed out here so).
    proc = subprocess.Popen([sys.executable, "-m", "hazards", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_for_runs(db_path, 3, proc)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


def test_sigkill_of_the_supervisor_loses_no_finished_run_and_resume_completes(tmp_path):
    db_path = tmp_path / "r.db"
    log = tmp_path / "started.log"  # one line per run the command actually executed
    env = {k: v for k, v in os.environ.items() if k != "HZ_STORE"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hazards", "run", "-n", "1000", "--timeout", "20", "--store", str(db_path),
         "--", "sh", "-c", f"echo run >> {log}"],
        cwd=tmp_path, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_runs(db_path, 5, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    time.sleep(0.2)  # let a run that was mid-exec finish its echo
    db = sqlite3.connect(db_path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    cid, = db.execute("SELECT id FROM campaigns").fetchone()
    seqs = [r[0] for r in db.execute("SELECT seq FROM runs ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 5
    started = len(log.read_text().splitlines())
    # every run that finished is stored: at most the one in flight at the kill is missing
    assert started - len(seqs) in (0, 1), (started, len(seqs))
    assert db.execute("SELECT status FROM campaigns").fetchone()[0] == "running"
    db.close()

    total = len(seqs) + 10
    resumed = hazards("run", "--resume", str(cid), "-n", str(total), "--json", "--store", str(db_path), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["campaign"] == cid and out["n"] == total and out["status"] == "complete"
    db = sqlite3.connect(db_path)
    assert [r[0] for r in db.execute("SELECT seq FROM runs ORDER BY seq")] == list(range(1, total + 1))
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_sigterm_marks_the_campaign_interrupted_and_exits_cleanly(tmp_path):
    db_path = tmp_path / "r.db"
    env = {k: v for k, v in os.environ.items() if k != "HZ_STORE"}
    env["PYTHONPATH"] = str(REPO)
    returncode, err = _signal_after_runs(
        ["run", "-n", "1000", "--store", str(db_path), "--", "true"], db_path, signal.SIGTERM, tmp_path, env, 30)
    assert returncode == 143 and "Traceback" not in err  # 128 + SIGTERM
    db = sqlite3.connect(db_path)
    assert db.execute("SELECT status FROM campaigns").fetchone()[0] == "interrupted"


def test_usage_errors_are_one_line_too(tmp_path):
    proc = hazards("run", "-n", "abc", "--", "true", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


SHOW_GPU = "import os, json; print('HZ_RESULT ' + json.dumps({'ok': True, 'cvd': os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}))"


def test_run_leases_a_gpu_and_the_program_runs_on_it(tmp_path):
    from hazards.engine.leases import read_lease_log

    gpus = {"HZ_FAKE_GPUS": "0,1", "HZ_LEASE_DIR": str(tmp_path / "leases"), "CUDA_VISIBLE_DEVICES": "1"}
    proc = hazards("run", "--json", "-n", "2", "--store", str(tmp_path / "r.db"), "--", sys.executable, "-c",
                   SHOW_GPU, cwd=tmp_path, env=gpus)
    assert proc.returncode == 0, proc.stderr
    with Store(tmp_path / "r.db") as store:
        assert {r.result.metrics["cvd"] for r in store.runs(json.loads(proc.stdout)["campaign"])} == {"1"}
    events = [(e["event"], e["gpu"]) for e in read_lease_log(tmp_path / "leases") if e.get("holder") == "hazards run"]
    assert events == [("acquire", "1"), ("release", "1")]


def test_run_on_a_gpu_someone_else_holds_is_one_line_and_exit_2(tmp_path, monkeypatch):
    from hazards.engine.leases import acquire

    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    monkeypatch.setenv("HZ_LEASE_DIR", str(tmp_path / "leases"))
    with acquire("0", "night soak"):
        proc = hazards("run", "-n", "1", "--store", str(tmp_path / "r.db"), "--", "true", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("hazards: error: GPU 0 is leased by pid ")
    assert "night soak" in proc.stderr and proc.stderr.count("\n") == 1


def test_run_without_a_gpu_leaves_the_programs_environment_alone(tmp_path):
    proc = hazards("run", "--json", "-n", "1", "--store", str(tmp_path / "r.db"), "--", sys.executable, "-c",
                   SHOW_GPU, cwd=tmp_path, env={"HZ_FAKE_GPUS": "", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr
    with Store(tmp_path / "r.db") as store:
        assert store.runs(json.loads(proc.stdout)["campaign"])[0].result.metrics["cvd"] == ""


def test_non_utf8_bytes_in_the_arguments_reach_the_program_and_are_stored_escaped(tmp_path):
    """Arguments are bytes on Linux: b'a\\xffb' (not UTF-8) passes through to the program
    unchanged (surrogateescape) and is stored and shown escaped ('a\\\\xffb'); the run is
    not lost to a traceback."""
    got = tmp_path / "argv.bin"
    (tmp_path / "keep.py").write_text("import os, sys; open('argv.bin', 'wb').write(os.fsencode(sys.argv[1]))\n")
    arg = os.fsdecode(b"a\xffb")
    proc = hazards("run", "-n", "2", "--store", str(tmp_path / "r.db"), "--", sys.executable, "keep.py", arg,
                   cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert got.read_bytes() == b"a\xffb"
    assert "a\\xffb" in proc.stdout
    db = sqlite3.connect(tmp_path / "r.db")
    targets = [t for (t,) in db.execute("SELECT target FROM runs")]
    assert len(targets) == 2 and all(t.endswith("'a\\xffb'") for t in targets), targets
    stats = hazards("stats", "--store", str(tmp_path / "r.db"), cwd=tmp_path)
    assert stats.returncode == 0 and "a\\xffb" in stats.stdout, stats.stdout + stats.stderr


@pytest.mark.parametrize("command", ["run", "soak"])
def test_ctrl_c_says_interrupted_and_the_exact_resume_command(tmp_path, command):
    """Ctrl-C mid-campaign: 'interrupted', and the command that continues it (with the
    store it used); soak printed only 'hazards: interrupted'."""
    db_path = tmp_path / "r.db"
    targets = tmp_path / "t.toml"
    targets.write_text("[[target]]\nname = 'ok'\nargv = ['true']\n")
    env = {k: v for k, v in os.environ.items() if k != "HZ_STORE"}
    env.update(PYTHONPATH=str(REPO), HZ_FAKE_GPUS="0", HZ_LEASE_DIR=str(tmp_path / "leases"))
    args = (["run", "-n", "100000", "--store", str(db_path), "--", "true"] if command == "run" else
            ["soak", "--budget", "10m", "--no-families", "--targets", str(targets), "--store", str(db_path)])
    returncode, err = _signal_after_runs(args, db_path, signal.SIGINT, tmp_path, env, 60)
    assert returncode == 130 and "Traceback" not in err, err
    cid = sqlite3.connect(db_path).execute("SELECT id FROM campaigns").fetchone()[0]
    assert "hazards: interrupted; campaign" in err, err
    assert f"`hazards {command} --resume {cid} --store {db_path}`" in err, err
