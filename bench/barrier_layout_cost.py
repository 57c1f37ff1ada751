"""The cost of sharing a cache line: barrier_layout's barrier, shared line vs separate lines.

One script, one run, side by side (needs a GPU). One warm `barrier_layout --serve` process
runs every configuration; each request is L launches of E barrier rounds, every launch
validated on the device (data words, spin timeouts, the barrier's final state), and the
barrier's cost read from the device clock (`ns_per_barrier`: first block start to last
block end per launch, summed, over L x E rounds). Configurations, per release kind
(0 st.global.wt, 1 st.release.gpu, 2 atom.release.gpu.exch):

  separate   slot_stride 128: eight release flags and the arrival counter on nine lines
  shared     slot_stride 4: all nine words in one 128-B line (the MoE barrier report's)

plus `false_sharing` (separate lines, but the consumers' done counter in the arrival
counter's line, next to it). Rounds are interleaved (every configuration once per round,
in a shuffled order) so that clock and thermal drift hit all of them alike. Ratios are of
medians over the rounds; `paired` is the median of the per-round ratios with their range.

Usage: python3 bench/barrier_layout_cost.py [--rounds 7] [--launches 20] [--epochs 500]
           [--words 16,256] [--json PATH]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hazards.families import get_family  # noqa: E402
from hazards.families.barrier_layout import RELEASE_KINDS  # noqa: E402
from hazards.stress_family import family_binary  # noqa: E402
from hazards.engine.outcome import Outcome  # noqa: E402
from hazards.engine.targets import ServerTarget  # noqa: E402
from bench.bench_json import save_json  # noqa: E402

SHARED_STRIDE, SEPARATE_STRIDE, NEXT_TO_COUNTER = 4, 128, 8 * 128 + 4


def configurations() -> dict[str, dict]:
    """name -> request fields (on top of the `fixed` variant)."""
    out = {}
    for r in RELEASE_KINDS:
        out[f"separate/r{r}"] = {"slot_stride": SEPARATE_STRIDE, "release": r}
        out[f"shared/r{r}"] = {"slot_stride": SHARED_STRIDE, "release": r}
    out["false_sharing/r0"] = {"slot_stride": SEPARATE_STRIDE, "release": 0, "done_offset": NEXT_TO_COUNTER}
    return out


def measure(target: ServerTarget, fields: dict, launches: int, timeout: float) -> dict:
    """One validated request; its device-clock cost per barrier round."""
    r = target.run({"variant": "fixed", **fields}, timeout=timeout, launches=launches)
    m = r.metrics or {}
    if r.outcome is not Outcome.CLEAN:
        return {"outcome": str(r.outcome), "reason": r.reason, "metrics": m}
    rounds = float(m["barrier_rounds"])
    return {"outcome": "clean", "ns_per_barrier": float(m["ns_per_barrier"]),
            "event_ns_per_barrier": float(m["kernel_ms"]) * 1e6 / rounds,
            "spin_timeouts": m.get("spin_timeouts"), "wrong_words": m.get("wrong_words")}


def summarize(samples: dict[str, list[dict]]) -> dict[str, dict]:
    """Per configuration: median / min ns per barrier over the clean rounds."""
    out = {}
    for name, rows in samples.items():
        ns = [s["ns_per_barrier"] for s in rows if s["outcome"] == "clean"]
        ev = [s["event_ns_per_barrier"] for s in rows if s["outcome"] == "clean"]
        out[name] = {"clean_rounds": len(ns), "failed_rounds": len(rows) - len(ns),
                     "median_ns": statistics.median(ns) if ns else None, "min_ns": min(ns) if ns else None,
                     "event_median_ns": statistics.median(ev) if ev else None,
                     "barriers_per_s": 1e9 / statistics.median(ns) if ns else None}
    return out


def ratio(samples: dict[str, list[dict]], summary: dict, num: str, den: str) -> dict:
    """Median ratio num/den, and the per-round (paired) ratios' median and range."""
    a, b = summary[num]["median_ns"], summary[den]["median_ns"]
    paired = [x["ns_per_barrier"] / y["ns_per_barrier"] for x, y in zip(samples[num], samples[den])
              if x["outcome"] == y["outcome"] == "clean"]
    return {"of_medians": a / b if a and b else None,
            "paired_median": statistics.median(paired) if paired else None,
            "paired_range": [min(paired), max(paired)] if paired else None}


def run(words: int, args: argparse.Namespace, target: ServerTarget) -> dict:
    configs = configurations()
    samples: dict[str, list[dict]] = {name: [] for name in configs}
    rng = random.Random(words)
    base = {"epochs": args.epochs, "words": words}
    for name in configs:  # warm-up: first launch of each kernel instance, allocations
        measure(target, {**configs[name], **base}, 2, args.timeout)
    for _ in range(args.rounds):
        order = list(configs)
        rng.shuffle(order)
        for name in order:
            samples[name].append(measure(target, {**configs[name], **base}, args.launches, args.timeout))
    summary = summarize(samples)
    ratios = {f"shared/separate r{r}": ratio(samples, summary, f"shared/r{r}", f"separate/r{r}")
              for r in RELEASE_KINDS}
    ratios["false_sharing/separate r0"] = ratio(samples, summary, "false_sharing/r0", "separate/r0")
    return {"words": words, "epochs": args.epochs, "launches": args.launches, "rounds": args.rounds,
            "summary": summary, "ratios": ratios, "samples": samples}


def print_result(res: dict) -> None:
    print(f"\nwords={res['words']} epochs/launch={res['epochs']} launches/request={res['launches']} "
          f"rounds={res['rounds']}  (ns per barrier round, device clock; every launch validated)")
    print(f"{'configuration':<20} {'median ns':>10} {'min ns':>10} {'events ns':>10} {'barriers/s':>12} {'clean':>7}")
    for name, s in res["summary"].items():
        if s["median_ns"] is None:
            print(f"{name:<20} {'FAILED':>10}  {s['failed_rounds']} failed rounds")
            continue
        print(f"{name:<20} {s['median_ns']:>10.1f} {s['min_ns']:>10.1f} {s['event_median_ns']:>10.1f} "
              f"{s['barriers_per_s']:>12,.0f} {s['clean_rounds']:>3}/{s['clean_rounds'] + s['failed_rounds']}")
    for name, r in res["ratios"].items():
        if r["of_medians"] is None:
            print(f"{name:<28} n/a")
            continue
        lo, hi = r["paired_range"]
        print(f"{name:<28} {r['of_medians']:.3f}x  (paired per round: median {r['paired_median']:.3f}x, "
              f"range {lo:.3f}-{hi:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--launches", type=int, default=20, help="launches per request")
    ap.add_argument("--epochs", type=int, default=500, help="barrier rounds per launch")
    ap.add_argument("--words", default="16,256", help="data words per producer and round (comma list)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    ap.add_argument("--json", type=Path, help="write every sample and the summary here")
    args = ap.parse_args()
    exe = family_binary(get_family("barrier_layout"))
    results = []
    with ServerTarget([str(exe.resolve()), "--serve"], name="barrier_layout") as target:
        target.start()
        print(f"device {target.handshake.get('device')} {target.gpu_uuid}, "
              f"{target.handshake.get('sm_count')} SMs; binary {exe}")
        for w in (int(x) for x in args.words.split(",") if x):
            res = run(w, args, target)
            print_result(res)
            results.append(res)
    save_json(args.json, {"binary": str(exe), "results": results})


if __name__ == "__main__":
    main()
