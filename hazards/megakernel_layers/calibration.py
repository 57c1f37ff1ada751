"""The tolerance of megakernel_layers, calibrated in the ragged-decode contract's style.

Rows, all against the torch reference (`reference.forward`, the kernel's precision) on the
same draws (data seeds):
  * E, the floor: an independent implementation (fp64 accumulation, attention chunked and
    LSE-merged) -- how far a correct computation of the same model lands;
  * D, the known-bad: each silent-corruption class re-created at the level of the math
    (`reference.MISHANDLINGS`), and, where a binary is given, the megakernel itself with
    that switch on (measured);
  * candidates: the megakernel with every switch off, and the binary's own unfused
    reference, measured through the binary's --dump mode.
The tolerance is sound when tol/E is comfortably above 1 and every D/tol is above 1; E is
the maximum over draws, each D the minimum (the least detectable).
More in docs/megakernel-layers.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from hazards.ragged_decode.calibration import Calibration, Row
from hazards.megakernel_layers import model as M
from hazards.megakernel_layers import reference as R

TOL = 2e-2
# Switches whose corruption is deterministic, so that one measured launch is a D row
# (stale_release, partial_no_fence and routing_no_fence are intermittent: rates, measured by
# bench/megakernel_layers_acceptance.py; their D rows are the torch re-creations).
MEASURED = ("stale_descriptor", "amax_tail", "dead_flag")


def dump_run(binary: str | os.PathLike[str], params: dict[str, Any], timeout: float = 120.0,
             env: dict[str, str] | None = None) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """One checked launch of the binary: (kernel output, the binary's reference, HZ_RESULT reply)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "dump.f32"
        proc = subprocess.run([str(binary), "--dump", str(path), json.dumps({"launches": 1, "params": params})],
                              capture_output=True, text=True, timeout=timeout, env=env)
        reply = {}
        for line in proc.stdout.splitlines():
            if line.startswith("HZ_RESULT "):
                reply = json.loads(line[len("HZ_RESULT "):])
        if not path.exists():
            raise RuntimeError(f"--dump wrote nothing (exit {proc.returncode}): {proc.stdout[-500:]} "
                               f"{proc.stderr[-500:]}")
        raw = torch.from_numpy(np.fromfile(path, dtype="float32"))
    n = raw.numel() // 2
    return raw[:n], raw[n:], reply


def calibrate(*, shape: str = "default", layers: int = 4, seq: int = 4096, seeds: Sequence[int] = (1, 2),
              tol: float = TOL, device: str = "cuda", binary: str | None = None,
              kernel_params: dict[str, Any] | None = None) -> Calibration:
    """Measure E, each D and the candidates on the same draws."""
    rows = {"E": Row("independent: fp64 accumulation, attention in 128-token chunks + LSE merge", "independent")}
    for name in R.MISHANDLINGS:
        rows[name] = Row(f"{name} (re-created in torch)", "mishandling")
    if binary:
        rows["kernel"] = Row("megakernel, every switch off", "candidate")
        rows["binref"] = Row("the binary's own unfused CUDA reference", "candidate")
        for name in MEASURED:
            rows[f"k:{name}"] = Row(f"{name} (the megakernel, measured)", "mishandling")
    for seed in seeds:
        w = R.make_weights(M.SHAPES[shape], layers, seq, seed, device)
        ref = R.forward(w)
        rows["E"].errors.append(R.rel_err(R.forward(w, acc=torch.float64, chunk_tokens=128), ref))
        for name, bad in R.MISHANDLINGS.items():
            rows[name].errors.append(R.rel_err(R.forward(w, bad=bad), ref))
        if binary:
            base = {"model": shape, "layers": layers, "seq": seq, "data_seed": seed, **(kernel_params or {})}
            out, bref, _ = dump_run(binary, base)
            rows["kernel"].errors.append(R.rel_err(out.to(ref.device), ref))
            rows["binref"].errors.append(R.rel_err(bref.to(ref.device), ref))
            for name in MEASURED:
                out, _, _ = dump_run(binary, {**base, "hazard": name})
                rows[f"k:{name}"].errors.append(R.rel_err(out.to(ref.device), ref))
        del w
        if device == "cuda":
            torch.cuda.empty_cache()
    return Calibration(list(rows.values()), tol, len(seeds))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", help="the megakernel_layers binary (adds the measured rows)")
    ap.add_argument("--model", default="default", choices=sorted(M.SHAPES))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tol", type=float, default=TOL)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", help="write the table as JSON here")
    a = ap.parse_args(argv)
    cal = calibrate(shape=a.model, layers=a.layers, seq=a.seq, seeds=a.seeds, tol=a.tol, device=a.device,
                    binary=a.binary)
    print(f"calibration: model {a.model}, {a.layers} layers, seq {a.seq}, seeds {a.seeds}, tol {a.tol:g}, "
          f"sound: {cal.sound()}")
    for name, err, ratio in cal.lines():
        print(f"  {name:<70} {err:>10}  {ratio}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "model": a.model, "layers": a.layers, "seq": a.seq, "seeds": a.seeds, "tol": a.tol,
            "sound": cal.sound(), "floor": cal.floor,
            "rows": [{"name": r.name, "kind": r.kind, "errors": r.errors, "worst": r.worst} for r in cal.rows]},
            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
