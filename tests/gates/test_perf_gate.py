"""`hazards gate perf` on fake commands emitting FAITHFUL_RESULT lines: every verdict
(faster, no-change, slower, sloughing, incorrect), the JSON object, the exit codes, the
exclusive lease, the alternating pair order (A B, B A) and the worker sweep."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hazards.engine.stats import Interval
from hazards.gates import perf

REPO = Path(__file__).resolve().parents[2]
FAKE = f"{sys.executable} {REPO / 'tests' / 'gates' / 'fake_faithful.py'}"
BASE = f"{FAKE} --role a --slow 100 --wall 300 --sum 5000"


def gate(*candidates: str, workers: str = "64", repeats: int = 8, extra: tuple[str, ...] = (),
         baseline: str = BASE) -> tuple[int, dict, str]:
    args = [sys.executable, "-m", "hazards", "gate", "perf", "--baseline", baseline, "--workers", workers,
            "--repeats", str(repeats), "--json", *extra]
    for c in candidates:
        args += ["--candidate", c]
    r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    out = json.loads(r.stdout) if r.stdout.strip() else {}
    return r.returncode, out, r.stderr


@pytest.fixture(autouse=True)
def _fake_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("HZ_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.setenv("HZ_STORE", str(tmp_path / "results.db"))


@pytest.mark.parametrize("cand,verdict,code", [
    (f"{FAKE} --role b --slow 80 --wall 250 --sum 4200", "faster", 0),
    (f"{FAKE} --role b --slow 100 --wall 300 --sum 5000", "no-change", 0),
    (f"{FAKE} --role b --slow 125 --wall 360 --sum 6000", "slower", 1),
    (f"{FAKE} --role b --slow 70 --wall 300 --sum 6500", "sloughing", 1),
    (f"{FAKE} --role b --slow 50 --wall 150 --sum 2000 --cos 0.5", "incorrect", 1),
])
def test_each_verdict_from_fake_commands(cand, verdict, code):
    rc, out, err = gate(cand)
    assert rc == code, err
    assert out["verdict"] == verdict
    [point] = out["points"]
    assert point["workers"] == 64 and point["verdict"] == verdict
    if verdict != "incorrect":
        ratios = point["ratios"]["attend"]
        for m in perf.METRICS:
            assert ratios[m]["lo"] <= ratios[m]["ratio"] <= ratios[m]["hi"]
        assert ratios["judged"] and not point["ratios"]["fill"]["judged"]  # 32 ns: below the timer's resolution
    else:
        assert "cos" in point["reason"] and point["cos"]["candidate"] == 0.5


def test_the_gate_is_a_stored_campaign_on_the_leased_frame():
    from hazards.engine.store import Store

    rc, out, err = gate(f"{FAKE} --role b --slow 125 --wall 360 --sum 6000")
    assert rc == 1 and out["verdict"] == "slower", err
    with Store(os.environ["HZ_STORE"], create=False) as store:
        camp = store.campaign(out["campaign"])
        runs = list(store.iter_runs(camp.id))
    assert camp.kind == "gate-perf" and camp.status == "complete"
    assert camp.spec["verdicts"] == {out["candidate"]: "slower"} and camp.spec["repeats"] == 8
    assert len(runs) == 2 * 8 and {r.result.outcome.value for r in runs} == {"clean"}
    assert camp.spec["sessions"][0]["gpus"]  # the frame's lease, recorded like every campaign's


def test_a_gate_stopped_by_a_failing_baseline_keeps_its_runs_and_says_stopped():
    from hazards.engine.store import Store

    rc, _, err = gate(f"{FAKE} --role b --slow 100 --wall 300 --sum 5000", baseline=f"{BASE} --cos 0.5")
    assert rc == 2 and "baseline failed its own check" in err
    with Store(os.environ["HZ_STORE"], create=False) as store:
        [camp] = store.campaigns("gate-perf")
        assert camp.status == "stopped" and len(list(store.iter_runs(camp.id))) == 1


def test_a_crashing_candidate_is_incorrect():
    rc, out, _ = gate(f"{FAKE} --role b --slow 10 --wall 10 --sum 10 --crash")
    assert rc == 1 and out["verdict"] == "incorrect" and "SIGSEGV" in out["points"][0]["reason"]


def test_the_verdict_follows_the_worker_count_and_the_worst_point_wins():
    rc, out, _ = gate(f"{FAKE} --role b --slow 100 --wall 300 --sum 5000 --faster-above 64", workers="8,128",
                      repeats=9)
    assert rc == 1 and out["verdict"] == "slower"
    assert [(p["workers"], p["verdict"]) for p in out["points"]] == [(8, "slower"), (128, "faster")]


def test_several_candidates_in_one_run_each_get_a_verdict():
    rc, out, _ = gate(f"{FAKE} --role b --slow 80 --wall 250 --sum 4200",
                      f"{FAKE} --role c --slow 70 --wall 300 --sum 6500")
    assert rc == 1 and out["verdict"] == "sloughing"
    assert [c["verdict"] for c in out["candidates"]] == ["faster", "sloughing"]


def test_workers_reach_the_command_as_placeholder_and_environment(tmp_path):
    log = tmp_path / "calls.txt"
    probe = (f"{sys.executable} -c \"import os,sys; open({str(log)!r}, 'a').write(sys.argv[1] + ' ' + "
             f"os.environ['HZ_NUM_WORKERS'] + ' ' + os.environ['HZ_GATE_SEED'] + ' ' + "
             f"os.environ['CUDA_VISIBLE_DEVICES'] + chr(10))\" {{workers}}")
    rc, out, err = gate(f"{FAKE} --role b --slow 100 --wall 300 --sum 5000", baseline=f"{probe}", repeats=2,
                        workers="8,132")
    # the probe prints no FAITHFUL_RESULT: the gate stops, but only after the first run shows the plumbing
    assert rc == 2 and "no FAITHFUL_RESULT line" in err
    assert log.read_text().splitlines()[0] == "8 8 0 0"


def test_baseline_and_candidate_alternate_with_the_same_seed(tmp_path):
    log = tmp_path / "order.txt"
    wrapper = tmp_path / "wrap.sh"
    wrapper.write_text("#!/bin/sh\nrole=$1; shift\necho \"$role$HZ_GATE_SEED\" >> " + str(log) + "\nexec \"$@\"\n")
    wrapper.chmod(0o755)
    rc, out, err = gate(f"{wrapper} B {FAKE} --role b --slow 100 --wall 300 --sum 5000",
                        baseline=f"{wrapper} A {BASE}", repeats=8)
    assert rc == 0, err
    # A B, then B A: running second in a pair must not read as the candidate's effect
    assert log.read_text().split() == [f"{side}{i}" for i in range(8) for side in ("AB" if i % 2 == 0 else "BA")]


def test_a_failing_baseline_or_a_malformed_line_stops_the_gate_with_exit_2():
    rc, _, err = gate(f"{FAKE} --role b --slow 100 --wall 300 --sum 5000", baseline=f"{BASE} --cos 0.5")
    assert rc == 2 and "baseline failed its own check" in err
    rc, _, err = gate(f"{FAKE} --role b --slow 100 --wall 300 --sum 5000 --malformed")
    assert rc == 2 and "could not be judged" in err and "malformed FAITHFUL_RESULT" in err


def test_the_gate_holds_an_exclusive_lease(tmp_path):
    from hazards.engine.leases import acquire

    with acquire("0", "someone-else", lock_dir=os.environ["HZ_LEASE_DIR"]):
        rc, _, err = gate(f"{FAKE} --role b --slow 100 --wall 300 --sum 5000", extra=("--wait", "1s"))
    assert rc == 2 and "someone-else" in err and "Traceback" not in err


@pytest.mark.parametrize("spec, words", [
    ("megakernel:nosuch", "unknown megakernel candidate 'nosuch' (known: baseline"),
    ("megakernel_layers:nosuch", "unknown layered-megakernel candidate 'nosuch'"),
    ("/nonexistent/program --x", "command not found: /nonexistent/program"),
])
def test_a_candidate_that_names_nothing_is_refused_before_waiting_for_a_gpu(spec, words):
    from hazards.engine.leases import acquire

    # the GPU is held by someone else for the whole call: only a refusal before the lease
    # answers "unknown ..."; one after it would wait and then say the GPU is taken
    with acquire("0", "someone-else", lock_dir=os.environ["HZ_LEASE_DIR"]):
        rc, _, err = gate(spec, extra=("--wait", "1s"))
        assert rc == 2 and words in err and "someone-else" not in err and "Traceback" not in err, err
        rc, _, err = gate(f"{FAKE} --role b", f"{FAKE} --role b", extra=("--wait", "1s"))
        assert rc == 2 and "the same candidate was given twice" in err, err


def test_bad_options_are_one_line_errors():
    for extra in (("--workers", "8,x"), ("--repeats", "0"), ("--conf", "1.5")):
        rc, _, err = gate(f"{FAKE} --role b --slow 1 --wall 1 --sum 1", extra=extra)
        assert rc == 2 and "Traceback" not in err, err


def _iv(est: float, lo: float, hi: float) -> Interval:
    return Interval(est, lo, hi, 0.95, 10)


@pytest.mark.parametrize("slow,wall,sum_,verdict", [
    ((0.8, 0.75, 0.85), (1.0, 0.98, 1.02), (1.0, 0.98, 1.02), "faster"),
    ((0.8, 0.75, 0.85), (1.0, 0.98, 1.02), (1.2, 1.1, 1.3), "sloughing"),
    ((1.0, 0.98, 1.02), (1.1, 1.05, 1.15), (1.0, 0.98, 1.02), "slower"),
    ((1.0, 0.98, 1.02), (1.0, 0.98, 1.02), (1.1, 1.05, 1.15), "slower"),
    ((0.99, 0.985, 0.995), (1.0, 0.98, 1.02), (1.0, 0.98, 1.02), "no-change"),  # significant but < min effect
    ((0.8, 0.6, 1.05), (1.0, 0.98, 1.02), (1.0, 0.98, 1.02), "no-change"),  # the interval includes 1
])
def test_judge_rules(slow, wall, sum_, verdict):
    ratios = {"slowCTA": _iv(*slow), "wall": _iv(*wall), "sumCTA": _iv(*sum_)}
    assert perf.judge(ratios, min_effect=0.02) == verdict


def test_worst_orders_the_verdicts():
    assert perf.worst(["no-change", "faster"]) is perf.PerfVerdict.FASTER
    assert [v.passing for v in perf.PerfVerdict] == [True, True, False, False, False]
    assert perf.worst(["faster", "slower"]) == "slower"
    assert perf.worst(["slower", "sloughing"]) == "sloughing"
    assert perf.worst(["sloughing", "incorrect", "faster"]) == "incorrect"
    assert perf.worst([]) == "no-change"


def test_only_selected_tasks_decide_but_every_task_is_reported():
    rc, out, err = gate(f"{FAKE} --role b --slow 125 --wall 360 --sum 6000", extra=("--task", "merge"))
    assert rc == 0 and out["verdict"] == "no-change", err  # attend got slower but only merge is judged
    ratios = out["points"][0]["ratios"]
    assert ratios["merge"]["judged"]
    assert not ratios["attend"]["judged"] and ratios["attend"]["why_not"] == "not selected (--task)"
    assert ratios["attend"]["slowCTA"]["lo"] > 1


def test_a_gate_that_can_judge_nothing_is_an_error_not_a_pass():
    rc, _, err = gate(f"{FAKE} --role b --slow 1 --wall 1 --sum 1", extra=("--task", "fill"))  # 32 ns spans
    assert rc == 2 and "no task could be judged" in err


def test_too_few_repeats_for_an_interval_is_an_error_before_the_long_run():
    rc, _, err = gate(f"{FAKE} --role b --slow 100 --wall 300 --sum 5000", workers="8,64,128", repeats=9)
    # 3 worker counts x 2 judged tasks x 3 metrics: 18 intervals at 1 - 0.05/18 need 10 pairs
    assert rc == 2 and "use --repeats 10 or more" in err and "x 3 metrics" in err, err


def test_a_task_that_names_nothing_stops_the_gate_after_the_first_run(tmp_path):
    # the task names come from the runs' FAITHFUL_RESULT lines, so the first baseline run is
    # the earliest they can be checked: one line there, not after the whole schedule
    from hazards.engine.store import Store

    rc, _, err = gate(f"{FAKE} --role b --slow 125 --wall 360 --sum 6000", extra=("--task", "atend"))
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "--task 'atend' names no task of the baseline's first run (its tasks:" in err and "attend" in err, err
    with Store(os.environ["HZ_STORE"], create=False) as store:
        [camp] = store.campaigns()
        assert store.campaign(camp.id).status == "stopped" and len(list(store.iter_runs(camp.id))) <= 2


def test_sides_that_give_one_task_id_two_names_are_an_error_not_a_comparison():
    # tasks are paired by numeric id: a side built elsewhere (a git revision, another program)
    # that numbers its tasks otherwise would compare two different tasks under one name
    def sample(names: dict[int, str], slow: float) -> perf.Sample:
        return perf.Sample(True, "ok", {t: {"task_id": t, "task": n, "slowCTA_us": slow, "wall_us": 2 * slow,
                                            "sumCTA_us": 40 * slow, "cos": 1.0} for t, n in names.items()})
    pairs = [perf.Pair(64, seed, sample({10: "worker", 2: "qkv"}, 100.0), sample({10: "router", 2: "qkv"}, 100.0))
             for seed in range(8)]
    for tasks in (None, ["qkv"]):
        with pytest.raises(perf.GateError, match=r"task 10 is 'worker' in the baseline's runs and 'router' in "
                                                 r"megakernel_layers:production@abc's"):
            perf.evaluate("megakernel_layers:production", "megakernel_layers:production@abc", pairs, tasks=tasks)
