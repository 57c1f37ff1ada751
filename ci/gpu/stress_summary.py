"""One line per variant of a `hazards stress --json` output, for a GPU round's console:
verdict, mismatched/launches, rate and its 95% interval, worst relative error, wall time.

Usage: python3 ci/gpu/stress_summary.py FILE [PREFIX] [NAME_WIDTH]
A file that is not JSON (the run died) prints `no JSON: why` and still exits 0.
"""
import json
import sys


def main(path: str, prefix: str = "", width: int = 16) -> None:
    try:
        d = json.load(open(path))
    except Exception as e:
        print(f"{prefix}no JSON:", e)
        return
    for v in d["variants"]:
        print(f"{prefix}{v['variant']:{width}s} {v['verdict']:10s} {v['failed_launches']}/{v['launches']} "
              f"rate {v['launch_rate']} ci95 {v['launch_rate_ci95']} maxerr {v['max_rel_err']:.3g} wall {v['wall_s']:.1f}s")


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:3], *[int(w) for w in sys.argv[3:4]])
