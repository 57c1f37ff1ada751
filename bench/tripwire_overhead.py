#!/usr/bin/env python3
"""Tripwire overhead: one benchmark kernel, tripwire on vs off, in one process and run.

The kernel (standalone/tripwire_bench/) is a persistent-megakernel-shaped loop: per layer
`phases` phases of FMA work each announced with HZ_TW_MARK, a grid barrier polled with
HZ_TW_POLL, a block barrier with per-warp arrival/exit points. It is compiled twice
(-DHZ_TRIPWIRE and not) and linked into one binary that times three configurations in
rotating order, one launch each per round: `on` (breadcrumbs written to a /dev/shm file,
cudaHostRegister'ed), `on_null` (compiled in, no file: base NULL), `off` (compiled out).
Prints the median of the per-round ratios (paired) and the ratio of medians; the goal
is <= 1% for `on`. Also checks that the three outputs are bit-identical and that the file
really holds the breadcrumbs (every worker DONE at the last generation).

usage: python3 bench/tripwire_overhead.py [--rounds 31] [--layers 300] [--phases 8]
       [--work 512] [--blocks-per-sm 2] [--mode registered|snapshot] [--json OUT]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hazards.engine import toolchain  # noqa: E402
from hazards.engine.tripwire import TripwireFile  # noqa: E402

SRC = ROOT / "standalone" / "tripwire_bench"
FLAGS = ["-O3", "-std=c++17", *toolchain.nvcc_arch_flags(toolchain.SM90A)]


def build(cache: Path) -> Path:
    """Compile the kernel twice (on/off) and link with the main; cached by source hash."""
    nvcc = toolchain.find_tool("nvcc", needed_for="to build the tripwire benchmark")
    files = sorted(SRC.glob("*.cu")) + [ROOT / "standalone" / "include" / "hz_tripwire.h",
                                        ROOT / "standalone" / "include" / "hz_tripwire_host.h",
                                        ROOT / "standalone" / "tripwire_host" / "hz_tripwire_host.c"]
    key = hashlib.sha256(b"".join(f.read_bytes() for f in files) + " ".join(FLAGS).encode()).hexdigest()[:16]
    out = cache / f"tw_bench-{key}"
    exe = out / "tw_bench"
    if exe.exists():
        return exe
    out.mkdir(parents=True, exist_ok=True)
    kern = SRC / "tw_bench_kernel.cu"
    steps = [
        [nvcc, *FLAGS, "-c", "-DHZ_TRIPWIRE", "-DTW_BENCH_SUFFIX=on", str(kern), "-o", str(out / "on.o")],
        [nvcc, *FLAGS, "-c", "-DTW_BENCH_SUFFIX=off", str(kern), "-o", str(out / "off.o")],
        [nvcc, *FLAGS, str(out / "on.o"), str(out / "off.o"), str(SRC / "tw_bench_main.cu"),
         str(ROOT / "standalone" / "tripwire_host" / "hz_tripwire_host.c"), "-o", str(exe)],
    ]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"build failed: {' '.join(cmd)}\n{r.stderr}")
    return exe


def pct(x: float) -> str:
    return f"{x * 100:+.2f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--layers", type=int, default=300)
    ap.add_argument("--phases", type=int, default=8)
    ap.add_argument("--work", type=int, default=512)
    ap.add_argument("--blocks-per-sm", type=int, default=2)
    ap.add_argument("--mode", choices=["registered", "snapshot"], default="registered")
    ap.add_argument("--binary", type=Path, help="prebuilt tw_bench (skip the build)")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    a = ap.parse_args()
    exe = a.binary or build(ROOT / ".hazards" / "build")
    with TripwireFile() as tw:
        env = {**os.environ, **tw.env()}
        if a.mode == "snapshot":
            env["HZ_TRIPWIRE_MODE"] = "snapshot"
        r = subprocess.run([str(exe), str(a.rounds), str(a.layers), str(a.phases), str(a.work), str(a.blocks_per_sm)],
                           capture_output=True, text=True, env=env, timeout=600)
        snap = tw.snapshot()
    if r.returncode not in (0, 1):
        sys.exit(f"tw_bench failed ({r.returncode}): {r.stderr.strip()}")
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    final = rows.pop()
    on = [x["on_ms"] for x in rows]
    null = [x["on_null_ms"] for x in rows]
    off = [x["off_ms"] for x in rows]
    paired_on = statistics.median(x / y for x, y in zip(on, off)) - 1
    paired_null = statistics.median(x / y for x, y in zip(null, off)) - 1
    done = sum(1 for s in snap.slots if s.done)
    gen = snap.header.generation if snap.header else 0
    print(f"tripwire overhead, {final['grid']} blocks x 256 threads, {final['layers']} layers x {final['phases']} "
          f"phases (work {final['work']}), {len(rows)} rounds, mode {final['mode']} ({r.stderr.strip()})")
    print(f"  off      median {statistics.median(off):.4f} ms")
    print(f"  on_null  median {statistics.median(null):.4f} ms   paired {pct(paired_null)}  "
          f"(ratio of medians {pct(statistics.median(null) / statistics.median(off) - 1)})")
    print(f"  on       median {statistics.median(on):.4f} ms   paired {pct(paired_on)}  "
          f"(ratio of medians {pct(statistics.median(on) / statistics.median(off) - 1)})")
    print(f"  stores per launch with the tripwire on: {final['marks_per_launch']} marks (8 B), "
          f"{final['warp_byte_stores_per_launch']} warp-point bytes")
    print(f"  outputs identical on/on_null/off: {final['outputs_identical']}; file after the run: generation {gen}, "
          f"{done}/{len(snap.slots)} workers DONE (mode {snap.header.mode_name if snap.header else '?'})")
    print(f"  goal <= 1%: {'met' if paired_on <= 0.01 else 'NOT met'} ({pct(paired_on)})")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "final": final, "paired_on": paired_on,
                                      "paired_on_null": paired_null, "file_generation": gen,
                                      "file_workers_done": done}, indent=1))
    ok = final["outputs_identical"] and done == len(snap.slots) and gen == final["generation"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
