#!/usr/bin/env python3
"""The AMDGCN checks of two gpu-hazards trees on the same listings (`.s` files, e.g. the
build cache's `*-user-*.s` of `hazards static --compile`): every error finding of the old
tree, and whether the new tree still makes it or what it says there instead (the
`sync-scope` info at the same listing line). For judging what a change to the checks
removed (docs/results/static-precision.md).

    python3 bench/amdgcn_findings_diff.py --old /tmp/old-tree --new . LISTING.s ...
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

_RUN = """
import json, sys
from hazards.static import amdgcn
out = []
for path in sys.argv[1:]:
    for f in amdgcn.check_listing(open(path).read(), path):
        out.append([path, f.check, f.severity, f.line, f.message])
print(json.dumps(out))
"""


def findings(tree: Path, listings: list[str]) -> list[list]:
    proc = subprocess.run([sys.executable, "-c", _RUN, *listings], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, check=True)
    return json.loads(proc.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True)
    ap.add_argument("--new", type=Path, required=True)
    ap.add_argument("listings", nargs="+")
    args = ap.parse_args()
    old, new = findings(args.old, args.listings), findings(args.new, args.listings)
    kept = {(p, c, ln) for p, c, s, ln, _ in new if s in ("error", "warning")}
    info = {(p, ln): m for p, c, s, ln, m in new if c == "sync-scope"}
    for path in args.listings:
        errors = [f for f in old if f[0] == path and f[2] in ("error", "warning")]
        print(f"## {Path(path).name}: {len(errors)} error finding(s) before, "
              f"{sum(1 for k in kept if k[0] == path)} after")
        for _, check, _, line, message in errors:
            now = "KEPT" if (path, check, line) in kept else f"GONE; now: {info.get((path, line), '(no note)')}"
            print(f"- line {line} [{check}] {message}\n  -> {now}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
