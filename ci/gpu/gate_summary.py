"""One line per candidate of a `hazards gate perf --json` output, for a GPU round's console:
its label, verdict and each task's slowCTA ratio at the first worker count.

Usage: python3 ci/gpu/gate_summary.py FILE
"""
import json
import sys


def main(path: str) -> None:
    d = json.load(open(path))
    for c in d.get("candidates", [d]):
        p = c["points"][0]
        r = {t: f"{v['slowCTA']['ratio']:.3f}" for t, v in p.get("ratios", {}).items()}
        print(c["candidate_side"]["label"], "->", c["verdict"], "| slowCTA ratios", r)


if __name__ == "__main__":
    main(sys.argv[1])
