"""Bit-for-bit and closeness comparisons of two builds of the layered megakernel on a GPU (the GPU tests'
shared checks).

A build is its defines (None: production, the default build) or a binary built already (a path)."""
from __future__ import annotations

import os


def checked_outputs(candidate: dict | os.PathLike | None, base: dict | os.PathLike | None, params: dict,
                    corrupting: bool | None = None) -> tuple:
    """(candidate's output, base's output): one checked launch of each build on `params`, both clean against
    the binary's reference (corrupted in both where `corrupting`; by default, with stale_descriptor on)."""
    if corrupting is None:
        corrupting = params.get("hazard") == "stale_descriptor"
    outs = []
    for build in (candidate, base):
        out, reply = _launch(build, params)
        assert (reply.get("mismatched", 0) > 0) if corrupting else reply.get("mismatched") == 0, (build, reply)
        outs.append(out)
    return outs[0], outs[1]


def _launch(build: dict | os.PathLike | None, params: dict) -> tuple:
    """(output, HZ_RESULT reply) of one checked launch of `build` on `params`."""
    from hazards.families import get_family
    from hazards.megakernel_layers.calibration import dump_run
    from hazards.stress_family import family_binary

    binary = build if isinstance(build, os.PathLike) else family_binary(get_family("megakernel_layers"), defines=build)
    out, _, reply = dump_run(binary, params)
    return out, reply


def assert_same_bits(candidate: dict | os.PathLike | None, base: dict | os.PathLike | None, params: dict,
                     corrupting: bool | None = None) -> None:
    """Both builds' checked launches clean against the binary's reference (corrupted in both where `corrupting`;
    by default, with stale_descriptor on) and their outputs equal bit for bit."""
    out, out_base = checked_outputs(candidate, base, params, corrupting)
    assert out.numel() == out_base.numel() and bool((out == out_base).all()), \
        f"candidate {candidate} and base {base} differ on {params}: {_difference(out, out_base)}"


def assert_not_same_bits(candidate: dict | os.PathLike | None, base: dict | os.PathLike | None, params: dict) -> None:
    """A negative control (a build that must not pass assert_same_bits): base's checked launch clean against the
    binary's reference and candidate's output not base's bits (some output differs; NaN differs from everything).
    Candidate's own check is not asserted (a control is expected to fail it): its reply is in the message."""
    out, reply = _launch(candidate, params)
    out_base, reply_base = _launch(base, params)
    assert reply_base.get("mismatched") == 0, (base, reply_base)
    assert not (out.numel() == out_base.numel() and bool((out == out_base).all())), \
        f"candidate {candidate} gives base {base}'s bits on {params} (its check: {reply})"
    print(f"candidate {candidate} against base {base} on {params}: {_difference(out, out_base)}, "
          f"{int((~out.isfinite()).sum())} not finite; its check mismatched {reply.get('mismatched')}")


def _difference(out, out_base) -> str:
    if out.numel() != out_base.numel():
        return f"{out.numel()} outputs against {out_base.numel()}"
    return f"{int((out != out_base).sum())} of {out.numel()} outputs not the same bits"


def assert_close(out, base) -> None:
    """Two builds that sum in other orders: cos > 0.99999, the largest difference under 2e-3 of base's largest
    value, and the family's relative error under a quarter of its tolerance."""
    import torch

    from hazards.families import get_family
    from hazards.megakernel_layers import reference as R

    a, b = out.double().flatten(), base.double().flatten()
    cos = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    worst = float((a - b).abs().max() / b.abs().max())
    assert cos > 0.99999 and worst < 2e-3, (cos, worst)
    tol = get_family("megakernel_layers").defaults["tol_e6"] * 1e-6
    assert R.rel_err(out, base) < tol / 4, (R.rel_err(out, base), tol)
