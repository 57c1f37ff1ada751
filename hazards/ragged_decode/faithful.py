"""The faithful per-task check of the ragged-decode megakernel: FAITHFUL_RESULT lines.

    python3 -m hazards.ragged_decode.faithful --candidate improved --workers 132
    HZ_NUM_WORKERS=66 python3 -m hazards.ragged_decode.faithful      # the perf gate's way
    python3 -m hazards.ragged_decode.faithful --serve                 # JSON-lines server
More in docs/megakernel.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Callable

from hazards.engine import profiler
from hazards.engine.classify import DEFAULT_FAITHFUL_COS_MIN
from hazards.ragged_decode import candidates
from hazards.engine.errors import UserError
from hazards.engine.protocol_server import StopServing
from hazards.ragged_decode.check import NoDevice, _device_error, serve_on_gpu

DEFAULT_COS_MIN = DEFAULT_FAITHFUL_COS_MIN  # one threshold: the classifier's
DEFAULT_LAUNCHES = 5
WARMUP_LAUNCHES = 2
RING_CAPACITY = 4096


def cosine(out: Any, ref: Any) -> float:
    """The smallest per-request cosine similarity of `out` and `ref` (rows), in float64.

    Per request, not over the flattened output: one wrong request among 128 barely moves a
    whole-output cosine (the ragged-decode contract's clamp-at-8192 mishandling scores 0.988 that way) but is
    a wrong answer. A request whose output and reference are both zero (no tokens) scores 1;
    a non-finite output scores -1.
    """
    import torch

    o, r = out.double().reshape(out.shape[0], -1), ref.double().reshape(ref.shape[0], -1)
    if not torch.isfinite(o).all():
        return -1.0
    no, nr = torch.linalg.vector_norm(o, dim=1), torch.linalg.vector_norm(r, dim=1)
    both_zero = (no == 0) & (nr == 0)
    cos = (o * r).sum(dim=1) / (no * nr).clamp_min(1e-300)
    cos = torch.where(both_zero, torch.ones_like(cos), cos)
    return float(cos.min())


class Faithful:
    """The arena, the reference and one profiled handle per (candidate build, workers)."""

    def __init__(self, lens_scale: int = 1, arena_seed: int = 0, ring: int = RING_CAPACITY) -> None:
        import torch

        from hazards.ragged_decode import kernel, reference

        if not torch.cuda.is_available():
            raise NoDevice("no CUDA-capable device is detected by torch")
        self.torch, self.kernel, self.ref = torch, kernel, reference
        cfg = dict(reference.CONTRACT_CFG)
        cfg["lens"] = [max(1, n // lens_scale) for n in reference.CONTRACT_LENS]
        self.cfg, self.lens_scale, self.ring = cfg, lens_scale, ring
        self.clamp = max(1, 8192 // lens_scale)
        self.k, self.v = reference.make_arena(cfg["lens"], cfg["n_kv"], cfg["hd"], device="cuda", seed=arena_seed)
        self.out = torch.empty(len(cfg["lens"]), cfg["n_q"] * cfg["hd"], dtype=torch.float32, device="cuda")
        self.handles: dict[tuple[Any, ...], Any] = {}

    def shape(self) -> dict[str, Any]:
        c = self.cfg
        return {"B": len(c["lens"]), "n_q": c["n_q"], "n_kv": c["n_kv"], "hd": c["hd"],
                "tokens": sum(c["lens"]), "lens_scale": self.lens_scale}

    def handle(self, cand: candidates.Candidate, workers: int | None) -> Any:
        key = (cand.handle_key(), workers)
        if key not in self.handles:
            self.handles[key] = self.kernel.build_sched(
                {}, {"k": self.k, "v": self.v}, self.cfg, 1, schedule="split", split_tokens=cand.split_tokens,
                grid=workers, copies=cand.copies, profile=True, ring_capacity=self.ring,
                stall_cycles=cand.stall_cycles, defines=cand.defines)
        return self.handles[key]

    def measure(self, cand: candidates.Candidate, workers: int | None, launches: int, seed: int,
                cos_min: float) -> dict[str, Any]:
        """Check one call, then profile `launches` calls; the per-task rows and the verdict."""
        torch = self.torch
        h = self.handle(cand, workers)
        gen = torch.Generator().manual_seed(seed)
        q, starts, lens = self.ref.draw_call(self.cfg["lens"], self.cfg["n_q"], self.cfg["hd"], gen, device="cuda")
        k_starts, k_lens = starts, lens
        if cand.mishandle == "clamp8192":
            k_lens = lens.clamp(max=self.clamp)
        elif cand.mishandle != "none":
            raise ValueError(f"unknown mishandling {cand.mishandle!r}")
        self.out.fill_(float("nan"))
        self.kernel.ragged_decode(h, q, k_starts, k_lens, out=self.out)
        expected = self.ref.reference_decode(q, self.k, self.v, starts, lens)
        torch.cuda.synchronize()
        cos = cosine(self.out, expected)
        rel = self.ref.rel_err(self.out, expected)
        for _ in range(WARMUP_LAUNCHES):
            self.kernel.ragged_decode(h, q, k_starts, k_lens, out=self.out)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        profiles, times = [], []
        for _ in range(launches):
            start.record()
            self.kernel.ragged_decode(h, q, k_starts, k_lens, out=self.out)
            stop.record()
            profiles.append(self.kernel.read_profile(h))  # synchronises
            times.append(start.elapsed_time(stop) * 1000.0)
        dropped = sum(p.dropped for p in profiles)
        if dropped:
            raise RingTooSmall(f"profiler ring overflow: {dropped} records dropped over {launches} launches "
                               f"(capacity {self.ring}); raise --ring")
        rows = profiler.summarize(profiles)
        build = h.lib._name.rsplit("/", 1)[-1].removesuffix(".so")
        common = {"cos": cos, "rel_err": rel if math.isfinite(rel) else None, "workers": h.grid,
                  "launches": launches, "dropped": 0, "shape": self.shape(), "build": build,
                  "candidate": cand.name, "kernel_us": profiler.median(times)}
        return {"rows": [{**r, **common} for r in rows], "cos": cos, "rel_err": rel,
                "mismatched": int(not cos >= cos_min), "kernel_us": common["kernel_us"]}


class RingTooSmall(ValueError):
    """The profiler ring overflowed: the metrics would be of a truncated launch."""


def workers_from_env(arg: int | None) -> int | None:
    """The grid size of a faithful check: --workers, else $HZ_NUM_WORKERS (the perf gate's
    way of passing it), else None (every SM)."""
    if arg is not None:
        return arg
    env = os.environ.get("HZ_NUM_WORKERS")
    if env is None or env.strip() == "":
        return None
    try:
        value = int(env)
    except ValueError:
        raise ValueError(f"HZ_NUM_WORKERS must be an integer, got {env!r}") from None
    return value


def faithful_parser(prog: str, doc: str | None, candidate_names: list[str], launches_help: str) -> argparse.ArgumentParser:
    """The arguments every faithful check takes (what the perf gate relies on): --serve,
    --candidate, --workers, --launches, --cos-min. A check adds its own after."""
    ap = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", action="store_true", help="speak the JSON-lines server protocol")
    ap.add_argument("--candidate", default="production", help=f"one of: {', '.join(candidate_names)}")
    ap.add_argument("--workers", type=int, default=None,
                    help="persistent grid size (default: $HZ_NUM_WORKERS, else every SM)")
    ap.add_argument("--launches", type=int, default=DEFAULT_LAUNCHES, help=launches_help)
    ap.add_argument("--cos-min", type=float, default=DEFAULT_COS_MIN, help="correctness threshold on cos")
    return ap


def _exit_for(exc: BaseException) -> int:
    return 3 if _device_error(exc) else 2


def once(args: argparse.Namespace) -> int:
    try:
        workers = workers_from_env(args.workers)
        if workers is not None and workers < 1:
            raise ValueError(f"the worker count must be >= 1, got {workers}")
        cand = candidates.get(args.candidate)
        res = Faithful(args.lens_scale, ring=args.ring).measure(cand, workers, args.launches, args.seed, args.cos_min)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line and an exit code
        print(f"faithful check: {type(exc).__name__}: {exc}", file=sys.stderr)
        return _exit_for(exc)
    for row in res["rows"]:
        print("FAITHFUL_RESULT " + json.dumps(row), flush=True)
    return 1 if res["mismatched"] else 0


def parse_request(req: dict[str, Any], lookup: Callable[[str], Any]) -> tuple[Any, int | None, int, float, int]:
    """(candidate, workers, launches, cos_min, seed) of a faithful server request (params
    candidate or variant, workers, seed, cos_min); UserError says what is wrong with it.
    `lookup` turns a candidate name into the candidate (UserError for an unknown one)."""
    params = req.get("params") or {}
    unknown = set(params) - {"candidate", "variant", "workers", "seed", "cos_min"}
    if unknown:
        raise UserError(f"unknown params: {sorted(unknown)}")
    cand = lookup(str(params.get("candidate", params.get("variant", "production"))))
    workers = params.get("workers")
    if workers is not None and (type(workers) is not int or workers < 1):
        raise UserError(f"workers must be a positive integer, got {workers!r}")
    launches = int(req.get("launches", 1))
    cos_min, seed = float(params.get("cos_min", DEFAULT_COS_MIN)), int(params.get("seed", req.get("id") or 0))
    return cand, workers, launches, cos_min, seed


def handle(faithful: Faithful, req: dict[str, Any]) -> dict[str, Any]:
    """One protocol request: check one call, profile `launches` calls; a bad_request reply
    saying why not; a device error ends the server (a sticky CUDA error poisons the context)."""
    try:
        cand, workers, launches, cos_min, seed = parse_request(req, candidates.get)
    except UserError as exc:
        return {"status": "bad_request", "message": str(exc)}
    try:
        res = faithful.measure(cand, workers, launches, seed, cos_min)
    except RingTooSmall as exc:
        return {"status": "bad_request", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001
        if _device_error(exc):
            raise StopServing(3, {"status": "fault", "message": f"{type(exc).__name__}: {exc}"}) from None
        return {"status": "bad_request", "message": f"{type(exc).__name__}: {exc}"}
    rel = res["rel_err"]
    # one call is checked against the reference; the profiled calls are timed, not checked
    return {"status": "ok", "launches": 1, "mismatched": res["mismatched"],
            "max_rel_err": rel if math.isfinite(rel) else 1e300, "kernel_ms": res["kernel_us"] / 1000.0,
            "seed": seed, "metrics": {"faithful": res["rows"], "cos": res["cos"], "profiled_launches": launches}}


def serve(args: argparse.Namespace) -> int:
    return serve_on_gpu(lambda: Faithful(args.lens_scale, ring=args.ring), handle, "megakernel-faithful",
                        "faithful check", variants=list(candidates.CANDIDATES))


def main(argv: list[str] | None = None) -> int:
    ap = faithful_parser("python3 -m hazards.ragged_decode.faithful", __doc__, list(candidates.CANDIDATES),
                         "profiled calls (medians over them)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the call's draw (not --serve)")
    ap.add_argument("--lens-scale", type=int, default=1, help="divide the ragged-decode contract's lengths by this")
    ap.add_argument("--ring", type=int, default=RING_CAPACITY, help="profiler ring capacity (spans per launch)")
    args = ap.parse_args(argv)
    if args.launches < 1 or args.lens_scale < 1 or args.ring < 1 or not -1.0 <= args.cos_min <= 1.0:
        print("faithful check: --launches, --lens-scale and --ring must be >= 1, --cos-min in [-1, 1]",
              file=sys.stderr)
        return 2
    return serve(args) if args.serve else once(args)


if __name__ == "__main__":
    sys.exit(main())
