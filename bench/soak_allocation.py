"""The same soak budget spent two ways, side by side in one run: `--allocation evidence` and
`--allocation uniform` (needs a GPU).

Each allocation runs `hazards soak --allocation A --explore 0 --budget B --json` on the same
families and registered targets, one after the other on the same GPU(s), each with its own
store. Besides the catalog families, the targets file registers some family binaries as
server targets with ONE launch per run (`--one-launch`), as a user's program or the megakernel
target is (a run is 1 launch for some targets and 200 for others): per-run bounds are then not
comparable, per-launch bounds are.

Reported per allocation (from each soak's --json `evidence`): runs, runs spent on canaries
after their first detection (and their share), the weakest clean per-launch upper bound
(and which item), every item's runs, launches and bounds; then the ratio uniform/evidence of
the weakest bound (the issue's goal: >= 5) and both canary re-run shares (goal: evidence
< 5%).

Usage: python3 bench/soak_allocation.py [--families pipeline,ordering,barrier_layout]
           [--one-launch pipeline:fixed,barrier_layout:fixed] [--budget 35] [--out DIR] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hazards.families import get_family  # noqa: E402
from hazards.stress_family import family_binary  # noqa: E402
from bench.bench_json import save_json  # noqa: E402


def targets_toml(one_launch: list[str]) -> str:
    """[[target]] tables: FAMILY:VARIANT on its launch server, one launch per run, expected clean."""
    q = json.dumps  # a JSON string is a valid TOML basic string
    out = []
    for spec in one_launch:
        fam_name, variant = spec.split(":", 1)
        fam = get_family(fam_name)
        fam.variant(variant)
        exe = family_binary(fam).resolve()
        out.append(f"[[target]]\nname = {q(fam_name + '-1launch')}\nvariant = {q(variant)}\nkind = \"server\"\n"
                   f"argv = [{q(str(exe))}, \"--serve\"]\nparams = {{ variant = {q(variant)} }}\n"
                   f"launches = 1\ntimeout = {fam.timeout_s}\nexpect = \"clean\"\n")
    return "\n".join(out)


def soak(allocation: str, args: argparse.Namespace, work: Path, targets: Path | None) -> dict:
    env = {**os.environ, "HZ_LEASE_DIR": str(work / "leases")}
    cmd = [sys.executable, "-m", "hazards", "soak", "--allocation", allocation, "--explore", "0",
           "--budget", f"{args.budget}s", "--families", args.families, "--store", str(work / f"{allocation}.db"),
           "--report", str(work / f"{allocation}.html"), "--json"]
    if targets is not None:
        cmd += ["--targets", str(targets)]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.budget + 600)
    (work / f"{allocation}.stderr").write_text(r.stderr)
    if r.returncode not in (0, 1):
        raise SystemExit(f"hazards soak --allocation {allocation} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def describe(allocation: str, d: dict) -> dict:
    ev = d["evidence"]
    worst = ev.get("worst_clean") or {}
    print(f"{allocation}: {ev['runs']} runs; {ev['canary_reruns']} on canaries after their first detection "
          f"({ev['canary_rerun_share']:.1%}); weakest clean per-launch bound {worst.get('launch_upper', float('nan')):.3g} "
          f"({worst.get('item')})")
    for key, it in sorted(ev["items"].items()):
        print(f"  {key:40s} {it['expect'] or '-':7s} runs {it['runs']:6d} launches {it['launches']:9d} "
              f"per-run <= {it['run_upper']:.3g} per-launch <= {it['launch_upper']:.3g} "
              f"after-detection {it['runs_after_detection']}")
    return {"runs": ev["runs"], "canary_reruns": ev["canary_reruns"], "canary_rerun_share": ev["canary_rerun_share"],
            "worst_clean": worst, "items": ev["items"], "flagged": d["flagged"], "blind": d["blind"],
            "gpus": d["gpus"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="pipeline,ordering,barrier_layout")
    ap.add_argument("--one-launch", default="pipeline:fixed,barrier_layout:fixed",
                    help="FAMILY:VARIANT targets at one launch per run (comma-separated; '' for none)")
    ap.add_argument("--budget", type=float, default=35.0, help="seconds per allocation")
    ap.add_argument("--out", type=Path, default=None, help="keep the stores and reports here")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="hz-allocation-"))
    work.mkdir(parents=True, exist_ok=True)
    one = [s for s in args.one_launch.split(",") if s]
    targets = None
    if one:
        targets = work / "targets.toml"
        targets.write_text(targets_toml(one))
    out: dict = {"budget_s": args.budget, "families": args.families, "one_launch": one}
    for allocation in ("evidence", "uniform"):
        out[allocation] = describe(allocation, soak(allocation, args, work, targets))
    e, u = out["evidence"]["worst_clean"], out["uniform"]["worst_clean"]
    if e and u:
        out["worst_bound_ratio_uniform_over_evidence"] = u["launch_upper"] / e["launch_upper"]
        print(f"weakest clean per-launch bound: uniform {u['launch_upper']:.3g} / evidence {e['launch_upper']:.3g} "
              f"= {out['worst_bound_ratio_uniform_over_evidence']:.2f}x (goal >= 5x)")
    print(f"canary re-runs: evidence {out['evidence']['canary_rerun_share']:.1%}, uniform "
          f"{out['uniform']['canary_rerun_share']:.1%} of runs (goal: evidence < 5%)")
    save_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
