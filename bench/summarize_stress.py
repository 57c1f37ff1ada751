"""Print the table of a `hazards stress --json` output file (for logs and results docs).

Usage: python3 bench/summarize_stress.py stress_pipeline.json
"""
from __future__ import annotations

import json
import sys


def fmt_rate(k: int, n: int, ci: list[float]) -> str:
    if not n:
        return "n/a"
    return f"{k}/{n} = {k / n:.4g} [{ci[0]:.4g}, {ci[1]:.4g}]"


def main(path: str) -> None:
    try:
        data = json.load(open(path))
    except (OSError, ValueError) as exc:
        print(f"{path}: no result ({exc})")
        return
    print(f"family {data['family']}: {data['requests']} requests x {data['launches_per_request']} launches"
          + (f", sanitizer {data['sanitizer']}" if data.get("sanitizer") else "")
          + (f", overrides {data['overrides']}" if data.get("overrides") else ""))
    print(f"{'variant':<16} {'role':<9} {'static':<7} {'verdict':<10} {'runs':<22} "
          f"{'mismatched launches [95% CI]':<42} {'weak/instances':<24} {'launches/s':>10} san.err")
    for v in data["variants"]:
        counts = " ".join(f"{k}:{c}" for k, c in v["campaign"]["counts"].items() if c)
        weak = f"{v['weak']:.0f}/{v['instances']:.4g}" if v.get("instances") else "-"
        lps = f"{v['validated_launches_per_s']:.0f}" if v.get("validated_launches_per_s") else "-"
        print(f"{v['variant']:<16} {v['role']:<9} {'hazard' if v['static']['hazardous'] else 'safe':<7} "
              f"{v['verdict']:<10} {counts:<22} {fmt_rate(v['failed_launches'], v['launches'], v['launch_rate_ci95']):<42} "
              f"{weak:<24} {lps:>10} {v['sanitizer_errors']}")


if __name__ == "__main__":
    main(sys.argv[1])
