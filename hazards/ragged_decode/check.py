"""The megakernel as a target the engine can soak: correctness of ragged decode, call by call.

    python3 -m hazards.ragged_decode.check --calls 8            # one batch: HZ_RESULT line, exit code
    python3 -m hazards.ragged_decode.check --calls 800 --repeat 200   # 4 draws, each launched 200 times
    python3 -m hazards.ragged_decode.check --serve              # JSON-lines server (docs/protocol.md)
More in docs/megakernel.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Callable

from hazards.engine.errors import UserError
from hazards.engine.progress import TAG as PROGRESS_TAG
from hazards.engine.protocol_server import StopServing, progress

TOL = 1e-2
MISHANDLINGS = ("none", "clamp8192", "ignore_starts")


class NoDevice(RuntimeError):
    """No GPU to check on: bad input for this check (exit 2), not a device error."""


class Checker:
    """A built schedule plus its arena: runs batches of checked calls."""

    def __init__(self, lens_scale: int = 1, schedule: str = "split", arena_seed: int = 0, *,
                 lens: list[int] | None = None, grid: int | None = None, split_tokens: int = 2048) -> None:
        import torch

        from hazards.ragged_decode import kernel, reference

        if not torch.cuda.is_available():
            raise NoDevice("no CUDA-capable device is detected by torch")
        self.torch, self.kernel, self.ref = torch, kernel, reference
        cfg = dict(reference.CONTRACT_CFG)
        cfg["lens"] = list(lens) if lens is not None else [max(1, n // lens_scale) for n in reference.CONTRACT_LENS]
        self.cfg = cfg
        self.config = {"lens": cfg["lens"], "grid": grid, "split_tokens": split_tokens, "schedule": schedule}
        self.clamp = max(1, 8192 // lens_scale)  # the contract's clamp, scaled with the lengths
        self.k, self.v = reference.make_arena(cfg["lens"], cfg["n_kv"], cfg["hd"], device="cuda", seed=arena_seed)
        self.handle = kernel.build_sched({}, {"k": self.k, "v": self.v}, cfg, 1, schedule=schedule, grid=grid,
                                         split_tokens=split_tokens)
        self.out = torch.empty(len(cfg["lens"]), cfg["n_q"] * cfg["hd"], dtype=torch.float32, device=self.k.device)
        self._other: "Checker | None" = None

    def configured(self, config: dict[str, Any], lens_scale: int = 1) -> "Checker":
        """The checker of another point of the configuration space (built once and kept
        until another is asked for); this one when `config` is its own."""
        if config == self.config:
            return self
        if self._other is None or self._other.config != config:
            if self._other is not None:
                self._other.release()
            self._other = None
            self._other = Checker(lens_scale, config["schedule"], lens=config["lens"], grid=config["grid"],
                                  split_tokens=config["split_tokens"])
        return self._other

    def release(self) -> None:
        """Drop this configuration's device buffers."""
        self.kernel.teardown(self.handle)
        self.k = self.v = self.out = None
        self.torch.cuda.empty_cache()

    def batch(self, calls: int, seed: int, mishandle: str = "none", repeat: int = 1,
              beat: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Run `calls` checked calls with draws from `seed`; counts and the worst error.
        `beat(label)` reports progress (default: the protocol's progress line of the request
        being served).

        `repeat` R launches each drawn input R times in a row (the draws come from the seed
        in the same order either way): its reference is computed once, beside its first
        launch, and every launch's output, poisoned before it, is compared with it on the
        device."""
        if mishandle not in MISHANDLINGS:
            raise ValueError(f"unknown mishandling {mishandle!r} (known: {', '.join(MISHANDLINGS)})")
        if repeat < 1:
            raise ValueError(f"repeat must be >= 1 (got {repeat})")
        torch = self.torch
        gen = torch.Generator().manual_seed(seed)
        mismatched, worst, bits, draws = 0, 0.0, 0, 0
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        kernel_ms = 0.0
        beat = beat or progress
        beat("started")  # as the family harness: the first call is within the stall window too
        for call in range(calls):
            if call % repeat == 0:
                q, starts, lens = self.ref.draw_call(self.cfg["lens"], self.cfg["n_q"], self.cfg["hd"], gen,
                                                     device=self.k.device)
                k_starts, k_lens = starts, lens
                if mishandle == "clamp8192":
                    k_lens = lens.clamp(max=self.clamp)
                elif mishandle == "ignore_starts":
                    k_starts = torch.zeros_like(starts)
                expected = ref_norm = None
                draws += 1
            self.out.fill_(float("nan"))
            start.record()
            self.kernel.ragged_decode(self.handle, q, k_starts, k_lens, out=self.out)
            stop.record()
            if expected is None:  # queued behind the draw's first launch, as the launch runs
                expected = self.ref.reference_decode(q, self.k, self.v, starts, lens).float()
                ref_norm = torch.linalg.vector_norm(expected)
            err_on_device = self.ref.rel_err_tensor(self.out, expected, ref_norm)
            # one read-back: it waits for the launch and its comparison (the events too)
            err, call_bits = torch.stack((err_on_device, self.kernel.error_word(self.handle).float())).tolist()
            kernel_ms += start.elapsed_time(stop)
            err = err if math.isfinite(err) else math.inf  # NaN/inf in the output
            bits |= int(call_bits)
            worst = max(worst, err)
            mismatched += int(not err <= TOL or bool(call_bits))
            beat(f"call {call + 1} of {calls}")  # a call that never ends is a stall (docs/stall.md)
        return {"launches": calls, "mismatched": mismatched, "max_rel_err": worst,
                "kernel_ms": kernel_ms / max(calls, 1), "seed": seed,
                "metrics": {"tol": TOL, "kernel_flags": self.kernel.flag_messages(bits), "repeat": repeat,
                            "draws": draws}}


def _device_error(exc: BaseException) -> bool:
    """A CUDA runtime error (sticky or not), as opposed to bad input or a missing GPU."""
    if isinstance(exc, NoDevice):
        return False
    text = str(exc)
    return "CUDA" in text or "cuda" in text or "illegal" in text


def stderr_beat(label: str) -> None:
    """A progress event of the command form: a line on stderr starting with the engine's
    progress tag (`hazards.engine.progress.TAG`; docs/stall.md)."""
    print(f"{PROGRESS_TAG.decode()} {label}", file=sys.stderr, flush=True)


def once(args: argparse.Namespace) -> int:
    try:
        res = Checker(args.lens_scale, args.schedule).batch(args.calls, args.seed, args.mishandle, args.repeat,
                                                            beat=stderr_beat)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line and an exit code
        print(f"megakernel check: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3 if _device_error(exc) else 2
    print("HZ_RESULT " + json.dumps({"ok": res["mismatched"] == 0, **res}), flush=True)
    return 1 if res["mismatched"] else 0


def handle(checker: Checker, req: dict[str, Any]) -> dict[str, Any]:
    """One protocol request: `launches` checked calls, or a bad_request reply saying why not."""
    from hazards.ragged_decode import space

    params = req.get("params") or {}
    unknown = set(params) - {"seed", "variant", "mishandle", "repeat", *space.CONFIG_KEYS}
    if unknown:
        return {"status": "bad_request", "message": f"unknown params: {sorted(unknown)}"}
    repeat = params.get("repeat", 1)
    if type(repeat) is not int or repeat < 1:
        return {"status": "bad_request", "message": f"repeat must be an integer >= 1 (got {repeat!r})"}
    mishandle = str(params.get("mishandle", "none"))
    if mishandle not in MISHANDLINGS:
        return {"status": "bad_request",
                "message": f"unknown mishandling {mishandle!r} (known: {', '.join(MISHANDLINGS)})"}
    if set(params) & set(space.CONFIG_KEYS):
        point = {k: v for k, v in params.items() if k in space.CONFIG_KEYS}
        try:
            config = space.config_of(point)
        except UserError as e:
            return {"status": "bad_request", "message": str(e)}
        if sum(config["lens"]) > space.MAX_TOKENS:
            return {"status": "bad_request", "message": f"{sum(config['lens']):,} tokens: more than the server's "
                                                        f"{space.MAX_TOKENS:,}"}
        try:
            checker = checker.configured(config, int(space.SPACE.resolve(point)["lens_scale"]))
        except UserError as e:  # the host refused the configuration (shared memory, schedule)
            return {"status": "bad_request", "message": str(e)}
    try:
        res = checker.batch(int(req.get("launches", 1)), int(params.get("seed", req.get("id"))), mishandle, repeat)
    except Exception as exc:  # noqa: BLE001 - a sticky CUDA error poisons the context
        raise StopServing(3, {"status": "fault" if _device_error(exc) else "bad_request",
                              "message": f"{type(exc).__name__}: {exc}"}) from None
    return {"status": "ok", **res}


def serve_on_gpu(make: Callable[[], Any], handler: Callable[[Any, dict[str, Any]], dict[str, Any]], server: str,
                 label: str, **hello: Any) -> int:
    """Build the GPU state with `make()`, then serve protocol requests with
    `handler(state, request)`. A failure to build is one stderr line and exit 3 (a device
    error) or 2 (no GPU, bad input)."""
    from hazards.engine.protocol_server import serve

    try:
        state = make()
        import torch

        props = torch.cuda.get_device_properties(0)
        uuid = getattr(props, "uuid", None)
    except Exception as exc:  # noqa: BLE001
        print(f"{label}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3 if _device_error(exc) else 2
    return serve(lambda req: handler(state, req),
                 {"server": server, "pid": os.getpid(), "device": props.name,
                  **({"gpu_uuid": f"GPU-{uuid}"} if uuid else {}), **hello})


def warmed(checker: Checker) -> Checker:
    """`checker` after one checked call (its result dropped; a broken kernel shows in the
    requests): the kernel's module and the torch reference's kernels are loaded before the
    first request, whose first call is within the stall window like every other."""
    checker.batch(1, seed=0)
    return checker


def serve_checks(args: argparse.Namespace) -> int:
    return serve_on_gpu(lambda: warmed(Checker(args.lens_scale, args.schedule)), handle, "megakernel",
                        "megakernel check")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m hazards.ragged_decode.check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", action="store_true", help="speak the JSON-lines server protocol")
    ap.add_argument("--calls", type=int, default=8, help="checked calls in the one batch (not --serve)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draws (not --serve)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="launch each drawn input this many times in a row (its reference computed once)")
    ap.add_argument("--lens-scale", type=int, default=1,
                    help="divide the contract's lengths by this")
    ap.add_argument("--schedule", default="split", choices=("split", "guided", "per_request"))
    ap.add_argument("--mishandle", default="none", choices=MISHANDLINGS,
                    help="feed the kernel a known-bad input (a canary for this check)")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.lens_scale < 1 or args.repeat < 1:
        print("megakernel check: --calls, --lens-scale and --repeat must be >= 1", file=sys.stderr)
        return 2
    from hazards.engine.extras import MissingExtra, require

    try:
        require("torch", "the megakernel check")
    except MissingExtra as e:
        print(f"megakernel check: {e}", file=sys.stderr)
        return 2
    return serve_checks(args) if args.serve else once(args)


if __name__ == "__main__":
    sys.exit(main())
