#!/usr/bin/env python3
"""The campaign table of docs/results/megakernel-layers-h200.md from ci/gpu/layers-campaign.sh's output.

    python3 ci/gpu/layers_campaign_table.py FOLDER   # the unpacked layers-campaign/ folder

One markdown row per gated candidate (its baseline, the gate's verdict, each task's slowCTA
ratio with its interval, cos; `launch`, where the gate timed it, is the plain build's time per
launch: gates from before it have no such row), then the step times of perf.json and its headline line, then
(where the round ran bench/ragged_decode_h200.py) the ragged-decode regression line. Reads
only what the run wrote; a file that is missing is said, not filled in.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

TASKS = ("qkv", "attn_chunk", "attn_merge", "oproj", "router_topk", "moe_w13", "moe_w2", "worker", "launch")
# The promotion rule's two rows (docs/gates.md): the profiled launch (the worker span) and the
# plain build's launch (what users run; the gate's `launch` row).
RULE_ROWS = {"worker": "the profiled launch", "launch": "the plain build's launch"}
# The ragged-decode megakernel's recorded time (docs/results/ragged-decode-h200.md: H200, 2026-11-30,
# split schedule, 747 us median = 0.980x that run's copy floor) and the issue's bound on a regression.
# Judged as a multiple of the same run's copy floor, so that a card with another bandwidth compares.
RAGGED_ROW = "megakernel (this kernel: split schedule, 2048-token tiles)"
RAGGED_RECORDED_US, RAGGED_RECORDED_X_FLOOR = 747.0, 0.980
RAGGED_BOUND = 0.02


def gate_rows(path: Path) -> list[str]:
    """One row per candidate of one gate's JSON."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return [f"| {path.name} | — | not readable: {type(exc).__name__} | — | — |"]
    rows = []
    for cand in data.get("candidates", [data]):
        base = cand["baseline_side"]["label"].split(":")[-1]
        name = cand["candidate_side"]["label"].split(":")[-1]
        point = cand["points"][0]
        ratios = point.get("ratios", {})
        cells = []
        for task in TASKS:
            r = ratios.get(task, {}).get("slowCTA")
            if r:
                cells.append(f"{task} {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]")
        if "launch" in cand.get("skipped_rows", {}):
            cells.append("launch not measured")
        cos = point.get("cos") or {}
        cos_text = f"{cos.get('baseline', float('nan')):.8f} / {cos.get('candidate', float('nan')):.8f}"
        judged = [t for t, r in ratios.items() if r.get("judged")]
        rule = ""
        if len(judged) == 1 and judged[0] in RULE_ROWS:
            rule = f" ({RULE_ROWS[judged[0]]}: --task {judged[0]})"
        elif judged and set(judged) <= set(RULE_ROWS):  # one gate judging both: each row's own verdict
            rule = " (" + ", ".join(f"--task {t} {point.get('tasks', {}).get(t, '?')}" for t in RULE_ROWS
                                    if t in judged) + ")"
        rows.append(f"| {name} | {base} | {cand['verdict']}{rule} | {'; '.join(cells) or '—'} | {cos_text} |")
    return rows


def ragged_line(path: Path) -> str:
    """The ragged-decode regression verdict from the bench's JSON: this run's split-schedule
    megakernel against the recorded 0.980x copy floor, within RAGGED_BOUND or not."""
    try:
        res = json.loads(path.read_text())
        [row] = [r for r in res["rows"] if r["name"] == RAGGED_ROW]
        us, x_floor = float(row["us"]), float(row["x_floor"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"ragged decode: {path.name} not readable ({type(exc).__name__}): no regression verdict"
    change = x_floor / RAGGED_RECORDED_X_FLOOR - 1
    verdict = "within" if change <= RAGGED_BOUND else "OVER"
    return (f"ragged decode ({res.get('device', '?')}): {us:.0f} us = {x_floor:.3f}x copy floor; recorded "
            f"{RAGGED_RECORDED_US:.0f} us = {RAGGED_RECORDED_X_FLOOR:.3f}x (H200, 2026-11-30): {change * 100:+.1f}%, "
            f"{verdict} the {RAGGED_BOUND * 100:.0f}% bound")


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: layers_campaign_table.py FOLDER (the unpacked layers-campaign/ output)", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    print("| candidate | judged against | gate verdict | slowCTA ratio per task [interval] | cos baseline / candidate |")
    print("|---|---|---|---|---|")
    gates = sorted(folder.glob("gate_*.json"))
    if not gates:
        print("| — | — | no gate output in this folder | — | — |")
    for path in gates:
        for row in gate_rows(path):
            print(row)
    if (folder / "ragged.json").exists():
        print("\n" + ragged_line(folder / "ragged.json"))
    perf = folder / "perf.json"
    if not perf.exists():
        print("\nperf.json: missing (the bench did not finish)")
        return 0
    res = json.loads(perf.read_text())
    floor = res["floor_us"]
    print(f"\ncopy floor {floor:.1f} us; read-stream floor {res.get('read_floor_us', float('nan')):.1f} us")
    steps = {"production": res["megakernel"], **res.get("also_define", {})}
    for name, mk in steps.items():
        print(f"{name}: {mk['us_off']:.1f} us = {mk['us_off'] / floor:.2f}x copy floor (tripwire compiled out); "
              f"tripwire compiled in {(mk['ratio_on_null_vs_off'] - 1) * 100:+.2f}%")
    print(res.get("headline", "no headline in perf.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
