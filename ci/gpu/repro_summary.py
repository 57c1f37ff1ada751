"""A `hazards repro --json` output in a few lines, for a GPU round's console: the outcome
counts, the rate in words with its 95% interval, then each of the first N failures' outcome
and tripwire sentence.

Usage: python3 ci/gpu/repro_summary.py FILE [N]   (N: failures shown, default 1)
"""
import json
import sys


def main(path: str, failures: int = 1) -> None:
    d = json.load(open(path))
    print(d.get("counts"), d.get("rate_in_words"), "ci_95", d.get("ci_95"))
    for f in d.get("failures", [])[:failures]:
        print(" ", f["outcome"], "|", (f.get("tripwire") or {}).get("sentence"))


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:3]))
