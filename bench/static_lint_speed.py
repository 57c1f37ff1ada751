#!/usr/bin/env python3
"""How long `hazards lint` takes over a tree of sources, on one CPU core.

Runs `python3 -m hazards lint TREE --json` `--repeat` times in a child pinned to one core
(`sched_setaffinity`), and prints, per run: the wall time, the child's CPU time (user +
system, from getrusage: what it costs on a core of its own, whatever else the machine is
doing), the file and asm-block counts the lint reports, and how many findings it printed.
The goal (issue: static checks that hold on real code) is < 15 s for ~6,000 files.

usage: python3 bench/static_lint_speed.py TREE [--repeat 3] [--no-expand] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(tree: Path, no_expand: bool) -> dict:
    """One pinned `hazards lint` child: wall and CPU seconds, counts, findings."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "hazards", "lint", str(tree), "--json", *(["--no-expand"] if no_expand else [])]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"hazards lint failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    summary = proc.stderr.strip().splitlines()[-1]
    counts = re.search(r"(\d+) source file\(s\), (\d+) asm block\(s\): (\d+) checked, (\d+) skipped", summary)
    findings = json.loads(proc.stdout or "[]")
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "files": int(counts.group(1)), "blocks": int(counts.group(2)),
            "checked": int(counts.group(3)), "skipped": int(counts.group(4)),
            "errors": sum(1 for f in findings if f["severity"] == "error"), "summary": summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-expand", action="store_true", help="lint without the macro expansion")
    ap.add_argument("--json", type=Path, help="also write the runs here")
    args = ap.parse_args()
    if not args.tree.is_dir():
        raise SystemExit(f"no such folder: {args.tree}")
    runs = [one_run(args.tree, args.no_expand) for _ in range(args.repeat)]
    for k, r in enumerate(runs, 1):
        print(f"run {k}: {r['cpu_s']:.2f} s CPU (one core), {r['wall_s']:.2f} s wall; {r['summary']}")
    cpu = statistics.median(r["cpu_s"] for r in runs)
    wall = statistics.median(r["wall_s"] for r in runs)
    print(f"median: {cpu:.2f} s CPU, {wall:.2f} s wall over {runs[0]['files']} files "
          f"({'meets' if cpu < 15 else 'misses'} the < 15 s goal on one core)")
    if args.json:
        args.json.write_text(json.dumps({"tree": str(args.tree), "no_expand": args.no_expand,
                                         "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
