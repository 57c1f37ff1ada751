"""Per-GPU launch rate during a soak vs one `hazards stress` on one GPU (needs a GPU).

Side by side in one run, on the same family variant and batch size:

  stress   `hazards stress FAMILY --variant V --launches L --requests R --json` on the
           first GPU alone; its `validated_launches_per_s` (launches / wall time of the
           request loop, warm server, supervisor-side timing)
  soak     `hazards soak --no-families --targets T` for S seconds, where T registers the
           same binary and variant as a server target, on every free GPU at once (leases,
           telemetry, the store, one loop per GPU); per GPU, launches of its requests after
           the first (the first one includes the server's start) over the time from the end
           of its first request to the end of its last

Prints one line per GPU and the ratio soak/stress per GPU (goal: >= 0.8: a soak keeps
the GPUs as busy as a plain stress run).

Usage: python3 bench/soak_vs_stress.py [--family pipeline] [--variant fixed]
           [--launches 200] [--requests 1000] [--seconds 60] [--out DIR] [--json PATH]
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
from hazards.engine.leases import lease_candidates  # noqa: E402
from hazards.engine.store import Store  # noqa: E402


def hazards(*args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hazards", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def stress_rate(args: argparse.Namespace, gpu: str, store: Path) -> float:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    r = hazards("stress", args.family, "--variant", args.variant, "--launches", str(args.launches),
                "--requests", str(args.requests), "--json", "--store", str(store), env=env, timeout=900)
    if r.returncode not in (0, 1):
        raise SystemExit(f"hazards stress failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    report = json.loads(r.stdout.strip().splitlines()[-1])
    return float(report["variants"][0]["validated_launches_per_s"])


def soak_rates(args: argparse.Namespace, work: Path) -> tuple[int, dict[str, dict]]:
    exe = family_binary(get_family(args.family)).resolve()
    targets = work / "targets.toml"
    q = json.dumps  # a JSON string is a valid TOML basic string
    targets.write_text(
        "[[target]]\n"
        f"name = {q(args.family)}\nvariant = {q(args.variant)}\nkind = \"server\"\n"
        f"argv = [{q(str(exe))}, \"--serve\"]\nparams = {{ variant = {q(args.variant)} }}\n"
        f"launches = {args.launches}\ntimeout = 60\n")
    store = work / "soak.db"
    env = {**os.environ, "HZ_LEASE_DIR": str(work / "leases")}
    r = hazards("soak", "--no-families", "--targets", str(targets), "--budget", f"{args.seconds}s",
                "--store", str(store), "--report", str(work / "soak.html"), env=env, timeout=args.seconds + 600)
    if r.returncode not in (0, 1):
        raise SystemExit(f"hazards soak failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    with Store(store, read_only=True) as s:
        cid = s.campaigns("soak")[-1].id
        per_gpu: dict[str, list] = {}
        for sr in s.iter_runs(cid):
            per_gpu.setdefault(sr.result.gpu_uuid or "?", []).append(sr.result)
    rates = {}
    for gpu, runs in per_gpu.items():
        runs.sort(key=lambda x: x.started_at)
        ends = [x.started_at + x.duration_s for x in runs]
        steady = runs[1:]
        span = ends[-1] - ends[0]
        launches = sum(int(x.metrics.get("launches") or 0) for x in steady if x.outcome.value in ("clean", "mismatch"))
        rates[gpu] = {"requests": len(runs), "launches_per_s": launches / span if span > 0 else 0.0,
                      "not_clean": sum(1 for x in runs if x.outcome.value != "clean")}
    return cid, rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="pipeline")
    ap.add_argument("--variant", default="fixed")
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--out", type=Path, default=None, help="keep the stores and the soak report here")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    gpus = [g for g, _ in lease_candidates()]
    if not gpus:
        raise SystemExit("no usable GPU: this benchmark needs at least one")
    work = args.out or Path(tempfile.mkdtemp(prefix="hz-soak-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    base = stress_rate(args, gpus[0], work / "stress.db")
    cid, rates = soak_rates(args, work)
    print(f"{args.family}/{args.variant}, {args.launches} launches per request")
    print(f"hazards stress, one GPU ({gpus[0]}), {args.requests} requests: {base:,.0f} validated launches/s")
    print(f"hazards soak campaign {cid}, {len(rates)} GPU(s), {args.seconds} s:")
    for gpu, r in sorted(rates.items()):
        r["ratio_to_stress"] = r["launches_per_s"] / base if base else float("nan")
        print(f"  {gpu}: {r['requests']} requests, {r['launches_per_s']:,.0f} launches/s, "
              f"ratio soak/stress {r['ratio_to_stress']:.2f}" + (f" ({r['not_clean']} not clean)" if r["not_clean"] else ""))
    worst = min((r["ratio_to_stress"] for r in rates.values()), default=float("nan"))
    print(f"worst per-GPU ratio soak/stress: {worst:.2f} (goal >= 0.80)")
    if args.json:
        args.json.write_text(json.dumps({"family": args.family, "variant": args.variant, "launches": args.launches,
                                         "stress_launches_per_s": base, "soak_campaign": cid, "soak": rates,
                                         "worst_ratio": worst, "gpus": gpus}, indent=2))


if __name__ == "__main__":
    main()
