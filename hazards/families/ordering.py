"""Family `ordering`: memory ordering between blocks on one GPU.

Kernel: `standalone/ordering/ordering.cu`; parameters, variants and the reasons for them:
`standalone/ordering/family.toml`. (a) Litmus tests MP, SB, LB, CoRR with many
instances per launch and the incantations of the GPU litmus literature (stress blocks on a
disjoint scratch region, pre-stress, id shuffling, a spin barrier, location stride and
permutation); every instance's outcome is classified on the device and the relaxed
("weak") outcome counts as a bad element. (b) `pc`: a persistent producer/consumer loop
reusing one buffer per pair; a consumer without acquire reads stale L1 lines.

The static model is the PTX memory model's verdict on the fences chosen: whether the weak
outcome is *allowed*. Allowed does not mean observed: only variants measured to fail on the
H200 are canaries (MP, SB and LB without fences under stress; pc without acquire). pc
without the release fence is allowed to fail but was not seen failing (0 in 1.7e7
pair-iterations), so it is a parameter point, not a canary.
"""
from __future__ import annotations

from typing import Any

from hazards.family import StaticVerdict, load_family

_WRITER_RELEASES = ("fence", "release")
_READER_ACQUIRES = ("fence", "acquire")


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Is the weak outcome allowed by the PTX memory model with these fences?"""
    p = FAMILY.resolve(params)
    test, w, r = p["test"], p["writer_sync"], p["reader_sync"]
    if test == "corr":
        return StaticVerdict(False, "coherence orders two reads of one location: r0=1, r1=0 is forbidden")
    if test == "sb":
        if w == "fence" and r == "fence":
            return StaticVerdict(False, "fence.sc on both sides forbids store buffering")
        return StaticVerdict(True, "store buffering needs a full fence between each side's store and "
                                   f"load (release/acquire does not order store->load); have {w}/{r}")
    ok = w in _WRITER_RELEASES and r in _READER_ACQUIRES
    what = {"mp": "message passing", "lb": "load buffering", "pc": "producer/consumer publication"}[test]
    if ok:
        return StaticVerdict(False, f"{what}: {w} on the writer and {r} on the reader synchronize")
    missing = []
    if w not in _WRITER_RELEASES:
        missing.append("the writer has no release (fence or st.release)")
    if r not in _READER_ACQUIRES:
        missing.append("the reader has no acquire (fence or ld.acquire)")
    return StaticVerdict(True, f"{what}: " + " and ".join(missing))


def instances_per_launch(params: dict[str, Any], sm_count: int = 132) -> int:
    """Litmus instances (or pc pair-iterations) one launch runs."""
    p = FAMILY.resolve(params)
    blocks = p["test_blocks"] or sm_count
    return blocks * p["iters"] if p["test"] == "pc" else blocks * p["threads"]


def strategy() -> Any:
    """Hypothesis strategy over run-time parameter points (see hazards/strategies)."""
    from hazards.strategies.ordering import ordering_points

    return ordering_points(tuple(v.name for v in FAMILY.variants))


# Parameters, variants, counters and their reasons: standalone/ordering/family.toml.
FAMILY = load_family("ordering", static_model=static_model, strategy=strategy)
