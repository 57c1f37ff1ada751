#!/usr/bin/env python3
"""The campaign table of docs/results/megakernel-layers-h200.md from ci/gpu/layers-campaign.sh's output.

    python3 ci/gpu/layers_campaign_table.py FOLDER   # the unpacked layers-campaign/ folder

One markdown row per gated candidate (its baseline, the gate's verdict, each task's slowCTA
ratio with its interval, cos), then the step times of perf.json and its headline line. Reads
only what the run wrote; a file that is missing is said, not filled in.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

TASKS = ("qkv", "attn_chunk", "attn_merge", "oproj", "router_topk", "moe_w13", "moe_w2", "worker")


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
        cos = point.get("cos") or {}
        cos_text = f"{cos.get('baseline', float('nan')):.8f} / {cos.get('candidate', float('nan')):.8f}"
        rows.append(f"| {name} | {base} | {cand['verdict']} | {'; '.join(cells) or '—'} | {cos_text} |")
    return rows


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
