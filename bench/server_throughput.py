"""Validated launches/s through the server target vs the same binary's raw in-process loop.

One script, one run, side by side (needs a GPU):

  raw        BIN --raw-loop N: N launches of the family kernel, no poisoning, no comparison,
             no protocol; rate = N / (CUDA-event time of the launch loop)
  validated  the same kernel through `hazards.engine.targets.ServerTarget`: every launch poisoned
             and compared on the device, R requests of L launches each; rate = R*L / wall
             time seen by the supervisor (request written -> reply parsed), per L
  device     the validated loop's own CUDA-event time from the replies (kernel + compare),
             to separate validation cost from protocol cost

Usage: python3 bench/server_throughput.py [--family pipeline] [--variant fixed]
           [--raw 20000] [--requests 20] [--launches 100,1000,10000] [--json PATH]
Prints a table; the last column is the ratio to raw (goal: >= 0.5).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hazards.families import get_family  # noqa: E402
from hazards.stress_family import family_binary  # noqa: E402
from hazards.engine.outcome import Outcome  # noqa: E402
from hazards.engine.targets import ServerTarget  # noqa: E402


def raw_rate(exe: Path, variant: str, n: int) -> dict:
    out = subprocess.run([str(exe), "--raw-loop", str(n), json.dumps({"variant": variant})],
                         capture_output=True, text=True, timeout=600)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("HZ_RAW ")), None)
    if out.returncode != 0 or line is None:
        raise SystemExit(f"raw loop failed (exit {out.returncode}): {out.stderr.strip()[-500:]}")
    return json.loads(line[len("HZ_RAW "):])


def server_rates(exe: Path, family: str, variant: str, requests: int, launches: list[int], timeout: float) -> list[dict]:
    rows = []
    with ServerTarget([str(exe), "--serve"], name=family) as target:
        target.run({"variant": variant}, timeout=timeout, launches=max(launches))  # warm-up
        for n in launches:
            kernel_ms = 0.0
            t0 = time.perf_counter()
            for _ in range(requests):
                r = target.run({"variant": variant}, timeout=timeout, launches=n)
                if r.outcome is not Outcome.CLEAN:
                    raise SystemExit(f"validated run not clean: {r.outcome} {r.reason}")
                kernel_ms += float(r.metrics.get("kernel_ms") or 0.0)
            wall = time.perf_counter() - t0
            rows.append({"launches_per_request": n, "requests": requests, "wall_s": wall,
                         "validated_launches_per_s": requests * n / wall,
                         "device_launches_per_s": requests * n / (kernel_ms * 1e-3) if kernel_ms else None})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="pipeline")
    ap.add_argument("--variant", default="fixed")
    ap.add_argument("--raw", type=int, default=20000, help="launches in the raw loop")
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--launches", default="100,1000,10000")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    fam = get_family(args.family)
    fam.variant(args.variant)
    exe = family_binary(fam).resolve()
    launches = [int(x) for x in args.launches.split(",")]
    raw = raw_rate(exe, args.variant, args.raw)
    rows = server_rates(exe, fam.name, args.variant, args.requests, launches, fam.timeout_s * 20)
    raw_lps = raw["launches_per_s"]
    print(f"{fam.name}/{args.variant}: raw in-process loop {raw_lps:,.0f} launches/s "
          f"({raw['launches']} launches in {raw['loop_ms']:.1f} ms)")
    print(f"{'launches/request':>17} {'validated/s (server)':>21} {'ratio to raw':>13} "
          f"{'device-side/s':>14}")
    for row in rows:
        row["ratio_to_raw"] = row["validated_launches_per_s"] / raw_lps
        dev = f"{row['device_launches_per_s']:,.0f}" if row["device_launches_per_s"] else "-"
        print(f"{row['launches_per_request']:>17} {row['validated_launches_per_s']:>21,.0f} "
              f"{row['ratio_to_raw']:>13.2f} {dev:>14}")
    if args.json:
        args.json.write_text(json.dumps({"family": fam.name, "variant": args.variant, "raw": raw,
                                         "server": rows}, indent=1))


if __name__ == "__main__":
    main()
