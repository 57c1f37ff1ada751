"""Bit-for-bit comparisons of two builds of the layered megakernel on a GPU (the GPU tests' shared check)."""
from __future__ import annotations


def assert_same_bits(candidate: dict | None, base: dict | None, params: dict, corrupting: bool | None = None) -> None:
    """Both builds' checked launches clean against the binary's reference (corrupted in both where `corrupting`;
    by default, with stale_descriptor on) and their outputs equal bit for bit."""
    from hazards.families import get_family
    from hazards.megakernel_layers.calibration import dump_run
    from hazards.stress_family import family_binary

    fam = get_family("megakernel_layers")
    if corrupting is None:
        corrupting = params.get("hazard") == "stale_descriptor"
    outs = []
    for defines in (candidate, base):
        out, _, reply = dump_run(family_binary(fam, defines=defines), params)
        assert (reply.get("mismatched", 0) > 0) if corrupting else reply.get("mismatched") == 0, (defines, reply)
        outs.append(out)
    assert outs[0].numel() == outs[1].numel() and bool((outs[0] == outs[1]).all())
