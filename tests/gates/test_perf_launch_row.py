"""The gate's `launch` row (the plain build's event time per launch, what users run) on the
CPU: judged with the gate's own statistics as one interval, faster / slower / no-change but
never sloughing; through the leased frame with a fake layered faithful server it is timed in
every sample of a megakernel_layers side, `--task launch` judges it alone, the default gate
includes it, and a side that could not measure it stops a `--task launch` gate at its first run
with the reason (the default gate says the row was left out, and why)."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from hazards.engine.stats import min_pairs
from hazards.gates import perf
from hazards.megakernel_layers import faithful as FA

REPO = Path(__file__).resolve().parents[2]


def sample(launch_us: float | None, *, worker_us: float = 900.0, single: bool = True) -> perf.Sample:
    rows = {11: {"task_id": 11, "task": "worker", "slowCTA_us": worker_us, "wall_us": worker_us + 5,
                 "sumCTA_us": worker_us * 132, "cos": 0.9999, "workers": 132}}
    if launch_us is not None:
        rows[FA.LAUNCH_TASK_ID] = {"task_id": FA.LAUNCH_TASK_ID, "task": "launch", "slowCTA_us": launch_us,
                                   "wall_us": launch_us, "sumCTA_us": launch_us, "cos": 0.9999, "workers": 132,
                                   **({"single_metric": True} if single else {})}
    return perf.Sample(True, "", rows)


def pairs(factor: float, n: int = 8, worker_factor: float = 1.0) -> list[perf.Pair]:
    rng = random.Random(7)
    out = []
    for i in range(n):
        drift = rng.gauss(0, 0.02)
        base = 600.0 * (1 + drift)
        out.append(perf.Pair(132, i, sample(base * (1 + rng.gauss(0, 0.001))),
                             sample(base * factor * (1 + rng.gauss(0, 0.001)), worker_us=900.0 * worker_factor)))
    return out


@pytest.mark.parametrize("factor, verdict", [(0.965, "faster"), (1.05, "slower"), (1.0, "no-change"),
                                             (0.99, "no-change")])
def test_the_launch_row_is_judged_as_one_interval(factor, verdict):
    res = perf.evaluate("production", "step_p", pairs(factor), tasks=["launch"])
    [point] = res["points"]
    assert point["tasks"] == {"launch": verdict} and res["verdict"] == verdict
    entry = point["ratios"]["launch"]
    assert entry["single_metric"] is True and entry["judged"] and entry["task_id"] == 1 << 16
    assert entry["slowCTA"] == entry["wall"] == entry["sumCTA"]
    assert res["judged_tests"] == 1 and res["interval_conf"] == pytest.approx(0.95)
    assert not point["ratios"]["worker"]["judged"]  # reported beside it, not deciding


def test_the_default_gate_counts_the_launch_row_once_and_never_calls_it_sloughing():
    # the launch 3.5% down while the profiled worker span is unchanged: faster, and no interval of
    # the row can say "slowCTA down, sumCTA up"
    res = perf.evaluate("production", "step_p", pairs(0.965))
    assert res["judged_tests"] == 3 + 1  # the worker's three metrics, the launch's one time
    [point] = res["points"]
    assert point["tasks"] == {"worker": "no-change", "launch": "faster"} and res["verdict"] == "faster"
    assert perf.judge({m: perf.ratio_interval([1.0] * 8, [0.9] * 8, 0.95) for m in perf.METRICS}, 0.02) \
        is perf.PerfVerdict.FASTER


def test_a_launch_row_without_the_single_metric_mark_counts_three_intervals():
    ps = [perf.Pair(p.workers, p.seed, sample(p.baseline.rows[FA.LAUNCH_TASK_ID]["slowCTA_us"], single=False),
                    p.candidate) for p in pairs(1.0)]
    assert perf.evaluate("production", "step_p", ps, tasks=["launch"])["judged_tests"] == 3


def test_repeats_are_checked_with_the_launch_row_as_one_interval():
    first = sample(600.0)
    perf.check_repeats(first, ["launch"], 1, min_pairs(0.95), 0.95, 1.0)  # 6 pairs for one interval
    with pytest.raises(perf.GateError, match=r"1 worker counts x \(0 tasks x 3 metrics \+ 1 single-metric row\)"):
        perf.check_repeats(first, ["launch"], 1, min_pairs(0.95) - 1, 0.95, 1.0)
    # 8 tasks x 3 + the launch = 25 intervals: 10 pairs (the campaign's) still give them
    rows = {t: {**first.rows[11], "task_id": t, "task": f"t{t}"} for t in range(2, 10)}
    perf.check_repeats(perf.Sample(True, "", {**rows, FA.LAUNCH_TASK_ID: first.rows[FA.LAUNCH_TASK_ID]}),
                       None, 1, 10, 0.95, 1.0)


# ---- through the frame, with the fake layered server (its launch row: 600 us x FAKE_PLAIN_FACTOR_<NAME>)
@pytest.fixture
def fake_server(monkeypatch, tmp_path):
    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(REPO / "tests")]))
    monkeypatch.setitem(perf.CATALOGS, "megakernel_layers:", "gates.fake_layers_server")
    monkeypatch.setenv("FAKE_PLAIN_FACTOR_STEP_P", "0.965")
    return dict(workers=[64], lock_dir=str(tmp_path / "leases"), store_path=tmp_path / "results.db", wait_s=5)


def test_the_gate_times_the_plain_build_in_every_sample_and_judges_it_with_task_launch(fake_server):
    from hazards.engine.store import Store

    out = perf.run_gate("megakernel_layers:production", ["megakernel_layers:step_p"], repeats=6, tasks=["launch"],
                        plain_launches=7, **fake_server)
    [point] = out["points"]
    assert out["verdict"] == "faster" and point["tasks"] == {"launch": "faster"}, perf.format_report(out)
    assert point["ratios"]["launch"]["slowCTA"]["ratio"] == pytest.approx(0.965, abs=0.005)
    assert {"qkv", "worker", "launch"} == set(point["ratios"]) and out["judged_tests"] == 1
    assert "launch     time per launch (plain build) 0.96" in perf.format_report(out)
    with Store(fake_server["store_path"], create=False) as st:
        camp = st.campaign(out["campaign"])
        runs = list(st.iter_runs(camp.id))
    assert camp.spec["plain_launches"] == 7 and len(runs) == 2 * 6
    for r in runs:  # every sample, either side: the profiled rows and the plain build's, one request
        launch = [row for row in r.result.metrics["faithful"] if row["task"] == "launch"]
        assert [row["launches"] for row in launch] == [7] and r.result.metrics["plain_launches"] == 7


def test_the_default_gate_includes_the_launch_row(fake_server):
    out = perf.run_gate("megakernel_layers:production", ["megakernel_layers:step_p"], repeats=9, **fake_server)
    [point] = out["points"]
    assert point["tasks"] == {"qkv": "no-change", "worker": "no-change", "launch": "faster"}
    assert out["verdict"] == "faster" and out["judged_tests"] == 3 + 3 + 1


def test_no_plain_launches_no_launch_row(fake_server):
    out = perf.run_gate("megakernel_layers:production", ["megakernel_layers:step_p"], repeats=8, plain_launches=0,
                        **fake_server)
    assert set(out["points"][0]["ratios"]) == {"qkv", "worker"} and out["verdict"] == "no-change"
    with pytest.raises(perf.GateError, match="--task 'launch' names no task of the baseline's first run"):
        perf.run_gate("megakernel_layers:production", ["megakernel_layers:step_p"], repeats=8, plain_launches=0,
                      tasks=["launch"], **fake_server)


def test_a_side_that_left_the_launch_row_out_stops_a_task_launch_gate_with_the_reason(fake_server, monkeypatch):
    monkeypatch.setenv("FAKE_PLAIN_SKIPPED", "step_p")
    with pytest.raises(perf.GateError) as err:
        perf.run_gate("megakernel_layers:production", ["megakernel_layers:step_p"], repeats=6, tasks=["launch"],
                      **fake_server)
    assert str(err.value) == ("--task 'launch': megakernel_layers:step_p's first run did not measure it: not "
                              "measured: the plain build from revision abababababab exited (code 2)")
    # the default gate judges what both sides measured and says which row was left out, and why
    out = perf.run_gate("megakernel_layers:production", ["megakernel_layers:step_p"], repeats=9, **fake_server)
    assert set(out["points"][0]["ratios"]) == {"qkv", "worker"} and out["verdict"] == "no-change"
    assert out["skipped_rows"] == {"launch": "megakernel_layers:step_p: not measured: the plain build from revision "
                                             "abababababab exited (code 2)"}
    assert "  launch: megakernel_layers:step_p: not measured" in perf.format_report(out)


def test_a_task_naming_the_left_out_launch_row_by_id_stops_with_the_reason(fake_server, monkeypatch):
    monkeypatch.setenv("FAKE_PLAIN_SKIPPED", "step_p")
    with pytest.raises(perf.GateError) as err:
        perf.run_gate("megakernel_layers:production", ["megakernel_layers:step_p"], repeats=6,
                      tasks=[str(1 << 16)], **fake_server)
    assert str(err.value) == ("--task '65536': megakernel_layers:step_p's first run did not measure it: not "
                              "measured: the plain build from revision abababababab exited (code 2)")


def test_the_cli_refuses_a_bad_plain_launches_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "hazards", "gate", "perf", "--baseline", "megakernel_layers:production",
                        "--candidate", "megakernel_layers:step_p", "--plain-launches", "-1"], cwd=REPO,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO), "HZ_LEASE_DIR": str(tmp_path)})
    assert r.returncode == 2 and "--plain-launches must be in [0, 1000], got -1" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
