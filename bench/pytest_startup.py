"""What an installed gpu-hazards costs an unrelated project's pytest start-up.

A one-test project in a temporary folder, run with this interpreter (which has gpu-hazards
installed) in three configurations, interleaved round by round so that machine load hits
each alike:

- `as installed`: every entry point pytest finds (gpu-hazards' options-only plugin, and
  hypothesis' own plugin, which gpu-hazards' core dependency on hypothesis brings);
- `-p no:hazards`: as if gpu-hazards were not installed but hypothesis were;
- `-p no:hazards -p no:hypothesispytest`: neither.

The medians' differences are gpu-hazards' own cost (its entry point) and hypothesis' plugin's
(which imports hypothesis at the end of every session; a user who does not use hypothesis
can add `-p no:hypothesispytest`). Prints a table; `--json PATH` keeps the raw timings.

    python3 bench/pytest_startup.py [--rounds 15] [--json out.json]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_json import save_json  # noqa: E402

CONFIGS = {
    "as installed": [],
    "-p no:hazards": ["-p", "no:hazards"],
    "-p no:hazards -p no:hypothesispytest": ["-p", "no:hazards", "-p", "no:hypothesispytest"],
}


def _session_seconds(project: Path, extra: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra], cwd=project,
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"pytest_startup: the unrelated project's session failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return elapsed


def _entry_point_import_seconds() -> float:
    """Importing gpu-hazards' entry point module alone, in a fresh interpreter that has pytest loaded."""
    code = ("import time, pytest; t = time.perf_counter(); import hazards.pytest_plugin.entry_point; "
            "print(time.perf_counter() - t)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", help="write the raw timings here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "test_unrelated.py").write_text("def test_nothing_to_do_with_gpus():\n    assert 1 + 1 == 2\n")
        for extra in CONFIGS.values():  # warm the file cache once
            _session_seconds(project, extra)
        times: dict[str, list[float]] = {name: [] for name in CONFIGS}
        for _ in range(args.rounds):
            for name, extra in CONFIGS.items():
                times[name].append(_session_seconds(project, extra))
    entry = statistics.median(_entry_point_import_seconds() for _ in range(5))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"pytest start-up of a one-test project, median of {args.rounds} interleaved rounds")
    for name, m in med.items():
        q = statistics.quantiles(times[name], n=4)
        print(f"  {name:40s} {m * 1000:7.0f} ms  (quartiles {q[0] * 1000:.0f}-{q[2] * 1000:.0f} ms)")
    ours = med["as installed"] - med["-p no:hazards"]
    hyp = med["-p no:hazards"] - med["-p no:hazards -p no:hypothesispytest"]
    print(f"gpu-hazards' entry point: {ours * 1000:+.0f} ms a session (importing the module alone: {entry * 1000:.0f} ms)")
    print(f"hypothesis' own pytest plugin: {hyp * 1000:+.0f} ms a session")
    save_json(args.json, {"rounds": args.rounds, "seconds": times, "median_s": med, "entry_point_import_s": entry,
                          "python": sys.version.split()[0]})


if __name__ == "__main__":
    main()
