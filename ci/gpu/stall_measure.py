"""Stall detection on a GPU: the measurements of docs/results/hangs-h200.md (ci/gpu/stall-h200.sh).

    python3 ci/gpu/stall_measure.py verdicts   OUT_DIR SECONDS   # time to a hang verdict, per hang canary
    python3 ci/gpu/stall_measure.py verdicts_table OUT_DIR       # verdicts.jsonl as a table
    python3 ci/gpu/stall_measure.py falsestall OUT_DIR SECONDS [NAME,...]  # clean runs under GPU contention + CPU load
    python3 ci/gpu/stall_measure.py check_summary OUT_DIR STORE [NAME [CHECK_JSON]]  # what a `hazards check` did

`verdicts`: every stress canary of `deadlock` and `megakernel_layers` on its family server
(the check's own work item), with the family's stall window (`after`; two hangs each: the
second on the server respawned after the first) and, for the first hang canary of the
families in BEFORE_FAMILIES, with stall detection off (`before`: the timeout alone; a
megakernel_layers hang's "before" is its 20 s timeout, measured in docs/results/hangs-h100.md,
not re-spent here). One line per
run in verdicts.jsonl: variant, mode, outcome, error kind, the run's duration (start of the
request to the verdict; the on-hang collectors are not registered here) and the wall time of
the whole run() call (the kill and the respawn included).

`falsestall`: while a second process keeps the GPU busy (torch matmuls back to back) and one
busy-looping process per CPU core loads the host, every clean variant of every runtime
family, and the ragged-decode megakernel's check server, runs requests with the family
window until 20,000 launches or its share of SECONDS. One line per item in falsestall.jsonl
(launches, requests, outcomes, stall verdicts, largest gap, the merged gap histogram);
gaps.json holds the histograms; the summary prints the gap distribution over all items.
NAME,... (optional) keeps only those families or FAMILY/VARIANT items (`ragged_decode` for the
megakernel's server), so one round too short for every item can be finished by a second.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hazards.engine.progress import bucket_upper_s
from hazards.engine.stall import FAMILY_STALL_S, quantile_upper
from hazards.engine.targets import ServerTarget
from hazards.engine.errors import UserError
from hazards.families import all_families, cuda_binary_families, named_items
from hazards.engine.loop import default_target_factory
from hazards.stress_family import family_item

HANG_FAMILIES = ("deadlock", "megakernel_layers")
BEFORE_FAMILIES = ("deadlock",)  # whose "before" (the timeout alone) is re-measured: 5 s each
LAUNCH_GOAL = 20_000
# The megakernel's check server: requests of RAGGED_LAUNCHES launches, each drawn input launched
# RAGGED_REPEAT times with its torch reference computed once (~150 ms under contention, the
# first call's gap) and every launch compared with it on the device (docs/megakernel.md).
RAGGED_LAUNCHES = 500
RAGGED_REPEAT = 500
HAMMER = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("hammer ready", flush=True)
n = 0
while True:
    for _ in range(20):
        a = (a @ b).clamp_(-1, 1)
    torch.cuda.synchronize()
    n += 20
"""


def out(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def server_for(fam):
    """The family's warm server as check and soak make it (its tripwire file included)."""
    return default_target_factory(family_item(fam), {})


def verdicts(dest: Path, seconds: float) -> None:
    t_end = time.monotonic() + seconds
    rows = dest / "verdicts.jsonl"
    fams = {f.name: f for f in all_families()}
    for name in HANG_FAMILIES:
        fam = fams[name]
        canaries = [v for v in fam.variants if v.role == "broken" and "stress" in v.detected_by]
        before_done = False
        with server_for(fam) as target:
            for v in canaries:
                hangs = 0
                runs = 0
                while hangs < 2 and runs < 40 and time.monotonic() < t_end:
                    t0 = time.monotonic()
                    r = target.run({"variant": v.name}, timeout=fam.timeout_s, launches=fam.default_launches,
                                   stall=FAMILY_STALL_S)
                    runs += 1
                    out(rows, {"family": name, "variant": v.name, "mode": "after", "stall_s": FAMILY_STALL_S,
                               "timeout_s": fam.timeout_s, "outcome": r.outcome.value, "error_kind": r.error_kind,
                               "duration_s": round(r.duration_s, 3), "wall_s": round(time.monotonic() - t0, 3),
                               "reason": r.reason[:300], "progress": (r.evidence or {}).get("progress")})
                    if r.outcome.value != "hang":
                        if r.outcome.value == "mismatch" and runs >= 3:
                            break  # a mismatch canary, not a hang one
                        continue
                    hangs += 1
                    if name in BEFORE_FAMILIES and not before_done and time.monotonic() + fam.timeout_s + 5 < t_end:
                        before_done = True
                        t0 = time.monotonic()
                        r = target.run({"variant": v.name}, timeout=fam.timeout_s, launches=fam.default_launches)
                        out(rows, {"family": name, "variant": v.name, "mode": "before", "stall_s": None,
                                   "timeout_s": fam.timeout_s, "outcome": r.outcome.value,
                                   "error_kind": r.error_kind, "duration_s": round(r.duration_s, 3),
                                   "wall_s": round(time.monotonic() - t0, 3), "reason": r.reason[:300]})


def verdicts_table(dest: Path) -> None:
    """verdicts.jsonl, one line per run."""
    path = dest / "verdicts.jsonl"
    rows = [json.loads(line) for line in path.open()] if path.exists() else []
    for r in rows:
        print(f"{r['mode']:6} {r['family']}/{r['variant']:18} {r['outcome']:8} {str(r['error_kind']):9} "
              f"verdict {r['duration_s']:7.2f} s  wall {r['wall_s']:7.2f} s  {r['reason'][:100]}")


def merge(into: dict, gaps: dict) -> None:
    for k, n in (gaps or {}).items():
        into[k] = into.get(k, 0) + n


def falsestall_target(fam):
    """The item's warm server: the family's, or the ragged-decode megakernel's check server."""
    if fam is None:
        return ServerTarget([sys.executable, "-m", "hazards.ragged_decode.check", "--serve"],
                            name="ragged_decode", grace_s=0.5, handshake_timeout_s=120)
    return server_for(fam)


def only_named(items: list, only: str) -> list:
    """The (family, variant) items (None, "ragged_decode" for the check server) that the
    NAME,... list `only` names, in their order; a name matching nothing exits with one line: it
    would measure nothing and print an empty, passing-looking round."""
    variants: dict = {}
    for fam, v in items:
        if fam is not None:
            variants.setdefault(fam.name, []).append(v)
    try:
        named = named_items(only, variants, also=("ragged_decode",))
    except UserError as e:
        sys.exit(f"stall_measure.py: {e}")
    return [(fam, v) for fam, v in items if ((fam.name, v) if fam else (v, None)) in named]


def falsestall(dest: Path, seconds: float, only: str = "") -> None:
    t_end = time.monotonic() + seconds
    rows = dest / "falsestall.jsonl"
    items = [(fam, v.name) for fam in cuda_binary_families() for v in fam.variants if v.role != "broken"]
    # the slow ones last: each item gets an even share of what is left, so they inherit
    # what the fast ones did not need to reach LAUNCH_GOAL
    items.sort(key=lambda fv: fv[0] is not None and fv[0].name == "megakernel_layers")
    items.append((None, "ragged_decode"))
    if only:
        items = only_named(items, only)
    hammer = subprocess.Popen([sys.executable, "-c", HAMMER], stdout=subprocess.PIPE, text=True)
    load: list = []
    targets: dict = {}
    try:
        if items:  # the first server starts (and builds) beside the hammer, before the CPU load
            fam = items[0][0]
            targets[fam.name if fam else "ragged_decode"] = first = falsestall_target(fam)
            t0 = time.monotonic()
            first.start()
            print(f"first server up in {time.monotonic() - t0:.1f} s", flush=True)
        ready = hammer.stdout.readline().strip()
        load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 4)]
        print(f"contention: {ready or 'hammer did not start'}; CPU load: {len(load)} busy processes", flush=True)
        all_gaps: dict = {}
        for i, (fam, variant) in enumerate(items):
            share = (t_end - time.monotonic()) / (len(items) - i)
            item_end = time.monotonic() + max(1.0, share)
            name = fam.name if fam else "ragged_decode"
            if name not in targets:
                for t in targets.values():
                    t.close()
                targets.clear()
                targets[name] = falsestall_target(fam)
            target = targets[name]
            params = {"repeat": RAGGED_REPEAT} if fam is None else {"variant": variant}
            per_request = RAGGED_LAUNCHES if fam is None else max(fam.default_launches, 200)
            timeout = 120.0 if fam is None else max(fam.timeout_s, 30.0)
            launches = requests = stalls = draws = 0
            outcomes: dict = {}
            gaps: dict = {}
            max_gap = 0.0
            reasons = []
            t0 = time.monotonic()
            while launches < LAUNCH_GOAL and time.monotonic() < item_end:
                r = target.run(params, timeout=timeout, launches=per_request, stall=FAMILY_STALL_S)
                requests += 1
                outcomes[r.outcome.value] = outcomes.get(r.outcome.value, 0) + 1
                if r.error_kind == "stall":
                    stalls += 1
                if r.outcome.value != "clean" and len(reasons) < 3:
                    reasons.append(r.reason[:300])
                launches += int((r.metrics or {}).get("launches") or 0)
                draws += int((r.metrics or {}).get("draws") or 0)
                prog = (r.evidence or {}).get("progress") or {}
                merge(gaps, prog.get("gaps"))
                max_gap = max(max_gap, float(prog.get("max_gap_s") or 0.0))
            merge(all_gaps, gaps)
            out(rows, {"item": f"{name}/{variant}", "launches": launches, "requests": requests,
                       "launches_per_request": per_request, "seconds": round(time.monotonic() - t0, 1),
                       "outcomes": outcomes, "stall_verdicts": stalls, "stall_s": FAMILY_STALL_S,
                       "max_gap_s": round(max_gap, 4), "p999_gap_upper_s": quantile_upper(gaps),
                       "gaps": gaps, "non_clean_reasons": reasons,
                       **({"params": params, "draws": draws} if fam is None else {})})
        (dest / "gaps.json").write_text(json.dumps(all_gaps, indent=1))
        total = sum(all_gaps.values())
        print(f"\ngap distribution over all items ({total} gaps between progress events, clean runs "
              f"under contention + load):")
        seen = 0
        for k in sorted(all_gaps, key=int):
            seen += all_gaps[k]
            print(f"  <= {bucket_upper_s(int(k)) * 1e3:9.1f} ms: {all_gaps[k]:8d}  (cumulative {seen / total:.6f})")
        for q in (0.5, 0.99, 0.999, 0.9999, 1.0):
            print(f"  quantile {q}: <= {quantile_upper(all_gaps, q)} s")
    finally:
        for t in targets.values():
            t.close()
        hammer.kill()
        for p in load:
            p.kill()
        for p in load + [hammer]:
            p.wait()


def check_summary(dest: Path, db: str, name: str = "check", check_json: str | None = None) -> None:
    """From `hazards check`'s store (and its --json output): when each canary was first seen
    failing (seconds from the campaign's start), each hang's duration and kind, the clean
    items' per-launch bounds, launches, requests and run time, the static part's time, and
    the gap distribution of the clean runs (no contention). Written to NAME-summary.json."""
    from hazards.engine.stats import upper_bound
    from hazards.engine.store import Store

    with Store(Path(db), read_only=True) as store:
        camp = store.campaigns("check")[-1]
        runs = store.runs(camp.id)
    t0 = camp.created
    first: dict = {}
    hangs = []
    clean: dict = {}
    gaps: dict = {}
    last_end = 0.0
    for sr in runs:
        r = sr.result
        key = f"{r.target}/{r.variant}"
        expect = next((i.get("expect") for i in camp.spec.get("items", []) if
                       f"{i['target']}/{i.get('variant', '')}" == key), None)
        end = r.started_at + r.duration_s - t0
        last_end = max(last_end, end)
        if r.outcome.value == "hang":
            hangs.append({"item": key, "error_kind": r.error_kind, "duration_s": round(r.duration_s, 3),
                          "reason": r.reason[:200]})
        if expect == "detect" and r.outcome.is_failure and key not in first:
            first[key] = round(end, 1)
        if expect == "clean":
            c = clean.setdefault(key, {"launches": 0, "failed": 0, "requests": 0, "run_s": 0.0, "largest": 0})
            if r.outcome.value in ("clean", "mismatch"):
                n = int((r.metrics or {}).get("launches") or 0)
                c["launches"] += n
                c["failed"] += int((r.metrics or {}).get("mismatched") or 0)
                c["largest"] = max(c["largest"], n)
            c["requests"] += 1
            c["run_s"] += r.duration_s
            merge(gaps, ((r.evidence or {}).get("progress") or {}).get("gaps"))
    canaries = sorted({f"{i['target']}/{i.get('variant', '')}" for i in camp.spec.get("items", [])
                       if i.get("expect") == "detect"})
    result = json.loads(Path(check_json).read_text()) if check_json and Path(check_json).is_file() else {}
    for c in clean.values():
        c["launch_upper"] = upper_bound(min(c["failed"], c["launches"]), c["launches"]) if c["launches"] else None
        c["run_s"] = round(c["run_s"], 2)
        c["s_per_launch"] = c["run_s"] / c["launches"] if c["launches"] else None
    summary = {"campaign": camp.id, "exit_code": result.get("exit_code"), "static_s": result.get("static_s"),
               "static_note": (result.get("static") or {}).get("note"), "gpu_budget_s": camp.spec.get("budget_s"),
               "last_run_end_s": round(last_end, 1), "runs": len(runs),
               "canaries": len(canaries), "detected": len(first),
               "not_detected": [c for c in canaries if c not in first],
               "all_detected_by_s": max(first.values()) if len(first) == len(canaries) and first else None,
               "first_detection_s": first, "hangs": hangs, "clean": clean,
               "clean_launch_upper": {k: c["launch_upper"] for k, c in clean.items()},
               "clean_gaps": gaps, "clean_gap_p999_upper_s": quantile_upper(gaps),
               "clean_gap_max_upper_s": quantile_upper(gaps, 1.0)}
    (dest / f"{name}-summary.json").write_text(json.dumps(summary, indent=1))
    bounds = [b for b in summary["clean_launch_upper"].values() if b is not None]
    print(f"static part: {summary['static_s']} s ({summary['static_note']}); GPU budget "
          f"{summary['gpu_budget_s']:.1f} s, last run ended {summary['last_run_end_s']} s after the campaign began")
    print(f"canaries detected: {len(first)} of {len(canaries)}; all by {summary['all_detected_by_s']} s "
          f"after the campaign began; not detected: {summary['not_detected']}")
    print(f"hangs: {len(hangs)}, of them stall verdicts: {sum(h['error_kind'] == 'stall' for h in hangs)}; "
          f"durations: {sorted(h['duration_s'] for h in hangs)}")
    if bounds:
        print(f"clean per-launch upper bounds (95%): weakest {max(bounds):.2e}, best {min(bounds):.2e}, "
              f"over {len(bounds)} clean items")
    for k, c in sorted(clean.items(), key=lambda kv: -kv[1]["run_s"]):
        print(f"  {k:42} {c['launches']:8d} launches {c['requests']:5d} req (largest {c['largest']:6d}) "
              f"{c['run_s']:7.2f} s run  bound {c['launch_upper'] or float('nan'):.2e}")
    print(f"clean runs' gaps (no contention): p99.9 <= {summary['clean_gap_p999_upper_s']} s, "
          f"largest <= {summary['clean_gap_max_upper_s']} s")


if __name__ == "__main__":
    mode, dest = sys.argv[1], Path(sys.argv[2])
    dest.mkdir(parents=True, exist_ok=True)
    if mode == "check_summary":
        check_summary(dest, sys.argv[3], *sys.argv[4:6])
    elif mode == "verdicts_table":
        verdicts_table(dest)
    else:
        {"verdicts": verdicts, "falsestall": falsestall}[mode](dest, float(sys.argv[3]), *sys.argv[4:5])
