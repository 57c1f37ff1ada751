"""bench/megakernel_layers_perf.py's headline line (the campaign's format), on the CPU."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    sys.path.insert(0, str(ROOT / "bench"))
    return load_script(ROOT / "bench" / "megakernel_layers_perf.py")


def test_the_headline_names_the_step_against_the_copy_floor_and_the_fastest_torch_path():
    bench = _bench()
    torch_res = {"eager": {"s": 3.1e-3, "what": "torch eager"},
                 "graph_fixed": {"s": 725.5e-6, "what": "torch CUDA graph (routing fixed, experts in place)"},
                 "compile_reduce-overhead": {"error": "CompileTimeout: ...", "what": "torch.compile"},
                 "fixed_ids": [[1, 2]], "eager_rel_err": 0.01}
    line = bench.headline(600.0, 248.0, torch_res)
    assert re.fullmatch(r"headline: step 600\.0 us = 2\.42x copy floor; best torch 725\.5 us "
                        r"\(torch CUDA graph \(routing fixed, experts in place\)\)", line), line
    assert bench.headline(600.0, 248.0, None) == "headline: step 600.0 us = 2.42x copy floor"


def test_the_campaign_table_reads_each_gates_verdict_ratios_and_cos(tmp_path):
    """ci/gpu/layers_campaign_table.py on round 3's recorded gate: a row per candidate with
    its baseline, verdict, the tasks' slowCTA ratios with intervals and both sides' cos; a
    missing bench output is said, not filled in."""
    import shutil
    import subprocess

    shutil.copy(ROOT / "docs/results/megakernel-layers-h200/round3/gate.json", tmp_path / "gate_r3.json")
    out = subprocess.run([sys.executable, str(ROOT / "ci/gpu/layers_campaign_table.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert "| production | sloughing |" in rows["chunks64"]
    assert "attn_merge 1.664 [1.564, 1.674]" in rows["chunks64"] and "0.99999984 / 0.99998724" in rows["chunks64"]
    assert "| incorrect |" in rows["stale_descriptor"]
    assert "perf.json: missing" in out


def test_the_campaign_table_says_which_gate_the_launch_alone_judged(tmp_path):
    """Each gate of the campaign runs twice, every task deciding and --task worker (the whole
    launch): the table marks the second, on the recorded H100 gates of step (e) (round 12)."""
    import shutil
    import subprocess

    gates = ROOT / "docs/results/megakernel-layers-h200/seventh-session-h100/gates"
    shutil.copy(gates / "production-step_e.json", tmp_path / "gate_e.json")
    shutil.copy(gates / "production-step_e-worker.json", tmp_path / "gate_e_launch.json")
    out = subprocess.run([sys.executable, str(ROOT / "ci/gpu/layers_campaign_table.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| step_e | production |")]
    assert len(rows) == 2, out
    assert "| slower |" in rows[0] and "| faster (the profiled launch: --task worker) |" in rows[1], rows
    assert "launch" not in rows[0].split("|")[4]  # a gate from before the plain build's row: none, still readable


def test_the_campaign_table_shows_the_plain_builds_launch_row(tmp_path):
    """A gate that timed the plain build has a `launch` row: the table shows its ratio, and each
    rule row's own verdict where one gate judged both (--task launch --task worker); a side that
    could not time it is said."""
    import json
    import subprocess

    def entry(ratio, judged):
        iv = {"ratio": ratio, "lo": ratio - 0.004, "hi": ratio + 0.004}
        return {"slowCTA": iv, "wall": iv, "sumCTA": iv, "judged": judged}

    gate = {"verdict": "faster", "baseline_side": {"label": "megakernel_layers:production"},
            "candidate_side": {"label": "megakernel_layers:step_p"},
            "points": [{"workers": 132, "verdict": "faster", "tasks": {"worker": "no-change", "launch": "faster"},
                        "cos": {"baseline": 0.99999, "candidate": 0.99998},
                        "ratios": {"qkv": entry(1.01, False), "worker": entry(0.984, True),
                                   "launch": {**entry(0.965, True), "single_metric": True}}}]}
    (tmp_path / "gate_p_launch.json").write_text(json.dumps(gate))
    only = {**gate, "points": [{**gate["points"][0], "tasks": {"launch": "faster"},
                                "ratios": {**gate["points"][0]["ratios"], "worker": entry(0.984, False)}}]}
    (tmp_path / "gate_p_plain.json").write_text(json.dumps(only))
    skipped = {**gate, "verdict": "no-change", "skipped_rows": {"launch": "megakernel_layers:step_p@ab: not measured"},
               "points": [{**gate["points"][0], "tasks": {"worker": "no-change"},
                           "ratios": {"worker": entry(0.984, True)}}]}
    (tmp_path / "gate_p_rev.json").write_text(json.dumps(skipped))
    out = subprocess.run([sys.executable, str(ROOT / "ci/gpu/layers_campaign_table.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| step_p | production |")]
    assert len(rows) == 3, out
    both, plain, rev = rows
    assert "| faster (--task worker no-change, --task launch faster) |" in both, both
    assert "worker 0.984 [0.980, 0.988]; launch 0.965 [0.961, 0.969]" in both
    assert "| faster (the plain build's launch: --task launch) |" in plain, plain
    assert "| no-change (the profiled launch: --task worker) |" in rev and "launch not measured" in rev, rev


def test_the_campaign_table_judges_the_ragged_decode_regression_against_the_recorded_time(tmp_path):
    """The promotion round runs bench/ragged_decode_h200.py: its split-schedule megakernel as a
    multiple of the same run's copy floor against the recorded 0.980x, within 2% or over; a
    bench output without that row gives no verdict (said, not filled in)."""
    import json

    table = load_script(ROOT / "ci" / "gpu" / "layers_campaign_table.py")
    row = {"name": table.RAGGED_ROW, "us": 752.0, "x_floor": 0.990}
    path = tmp_path / "ragged.json"
    path.write_text(json.dumps({"device": "NVIDIA H200", "rows": [row]}))
    assert "752 us = 0.990x copy floor" in table.ragged_line(path) and "+1.0%, within the 2% bound" in table.ragged_line(path)
    path.write_text(json.dumps({"rows": [{**row, "x_floor": 1.01}]}))
    assert "+3.1%, OVER the 2% bound" in table.ragged_line(path)
    path.write_text(json.dumps({"rows": [{"name": "torch eager per-request loop (the reference)", "us": 1.0}]}))
    assert "no regression verdict" in table.ragged_line(path)


def test_each_other_build_prints_its_own_paired_tripwire_costs_writing_included():
    """An --also-define build (the tripwire's diagnostic builds among them) gets its own paired costs, compiled
    in without a file and writing, as the first build does, and its rows against the first's."""
    bench = _bench()
    first = {"us_off": 594.0, "us_on_null": 608.3, "us_on_file": 607.7, "ratio_on_null_vs_off": 1.0240,
             "ratio_on_file_vs_off": 1.0232}
    no_marks = {"us_off": 600.0, "us_on_null": 606.0, "us_on_file": 609.0, "ratio_on_null_vs_off": 1.0100,
                "ratio_on_file_vs_off": 1.0150}
    lines = bench.tripwire_cost_lines(first, {"MKL_TW_NO_MARKS=1": no_marks}, 15)
    assert lines[0] == "tripwire cost (paired median of 15 rounds): compiled in, no file +2.40%; writing +2.32%"
    assert lines[1].startswith("  [MKL_TW_NO_MARKS=1]: compiled in, no file +1.00%; writing +1.50%;"), lines[1]
    assert "compiled out 1.010, compiled in, no file 0.996, writing 1.002" in lines[1], lines[1]
    without_file = {k: v for k, v in no_marks.items() if "file" not in k}
    assert bench.tripwire_cost_lines(first, {"x": without_file}, 15)[1].endswith("compiled in, no file 0.996")
