"""Family `ordering`: memory ordering between blocks on one GPU.

Kernel: `standalone/ordering/ordering.cu`. (a) Litmus tests MP, SB, LB, CoRR with many
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

from hazards import presets
from hazards.family import Family, StaticVerdict, Variant

# The binary's declared defaults (ordering.cu's ParamSpec list); checked by tests/families.
DEFAULTS: dict[str, Any] = {
    "test": "mp", "writer_sync": "fence", "reader_sync": "fence", "test_blocks": 0,
    "threads": 256, "stride": 1, "permute": False, "shuffle": False, "barrier": False,
    "stress_blocks": 0, "stress_lines": 64, "stress_pattern": "st_ld", "stress_iters": 4096,
    "pre_stress": 0, "iters": 64, "elems": 4,
}

# The incantations every litmus variant runs under: the configuration measured best on the
# H200 (docs/results/families-h200.md). Without them MP's weak outcome was never observed
# (0 in 4.8e9 instances); with them it shows in every launch.
LITMUS_STRESS: dict[str, Any] = {"barrier": True, "stress_blocks": 264, "stress_pattern": "st_st",
                                 "stress_lines": 64, "stress_iters": 1024}


def _litmus(test: str, writer: str, reader: str) -> dict[str, Any]:
    return {"test": test, "writer_sync": writer, "reader_sync": reader, **LITMUS_STRESS}


VARIANTS = (
    Variant("mp_fenced", "fixed", "message passing with __threadfence on both sides, under stress",
            params=_litmus("mp", "fence", "fence")),
    Variant("mp_relacq", "fixed", "message passing with st.release / ld.acquire at gpu scope, under stress",
            params=_litmus("mp", "release", "acquire")),
    Variant("mp_plain", "broken", "message passing with plain volatile accesses, no fences, under stress",
            params=_litmus("mp", "none", "none"), detected_by=("stress",)),
    Variant("sb_fenced", "fixed", "store buffering with __threadfence on both sides, under stress",
            params=_litmus("sb", "fence", "fence")),
    Variant("sb_plain", "broken", "store buffering without fences, under stress",
            params=_litmus("sb", "none", "none"), detected_by=("stress",)),
    Variant("lb_fenced", "fixed", "load buffering with __threadfence on both sides, under stress",
            params=_litmus("lb", "fence", "fence")),
    Variant("lb_plain", "broken", "load buffering without fences, under stress",
            params=_litmus("lb", "none", "none"), detected_by=("stress",)),
    Variant("corr", "fixed", "read-read coherence on one location (no fences needed), under stress",
            params=_litmus("corr", "none", "none")),
    Variant("pc_fixed", "fixed", "producer/consumer: release fence before the flag, ld.acquire.gpu on it",
            params={"test": "pc", "writer_sync": "fence", "reader_sync": "acquire"}),
    Variant("pc_fence", "fixed", "producer/consumer: __threadfence on both sides",
            params={"test": "pc", "writer_sync": "fence", "reader_sync": "fence"}),
    Variant("pc_no_acquire", "broken", "consumer spins on a volatile flag, then plain loads: stale L1 lines",
            params={"test": "pc", "writer_sync": "fence", "reader_sync": "none"},
            detected_by=("stress",)),
)
_BY_NAME = {v.name: v for v in VARIANTS}

RUNTIME_PARAMS = {
    "test": "mp | sb | lb | corr | pc (persistent producer/consumer)",
    "writer_sync": "none | fence | release: between thread 0's accesses (pc: data -> flag)",
    "reader_sync": "none | fence | acquire: between thread 1's accesses (pc: flag -> data)",
    "test_blocks": "blocks running instances (pc: producer/consumer pairs); 0 = one per SM",
    "threads": "threads per block (power of two); litmus instances = test_blocks*threads",
    "stride": "words between consecutive instances' locations",
    "permute": "y of instance i at a permuted slot (location permutation)",
    "shuffle": "randomise block roles, thread ids and partner blocks per launch",
    "barrier": "spin barrier over the test blocks before the test",
    "stress_blocks": "extra blocks stressing a disjoint scratch region",
    "stress_lines": "128-byte scratch lines the stress hits",
    "stress_pattern": "st_st | st_ld | ld_st | ld_ld",
    "stress_iters": "stress iterations per thread (stop early when the test is done)",
    "pre_stress": "stress iterations by the testing threads before the test",
    "iters": "pc: iterations per launch (instances = pairs*iters)",
    "elems": "pc: buffer words per thread",
}

_WRITER_RELEASES = ("fence", "release")
_READER_ACQUIRES = ("fence", "acquire")


def resolve(params: dict[str, Any]) -> dict[str, Any]:
    """Defaults <- the named variant's preset <- explicit fields (as the binary resolves)."""
    return presets.resolve(DEFAULTS, VARIANTS, params)


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Is the weak outcome allowed by the PTX memory model with these fences?"""
    p = resolve(params)
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
    p = resolve(params)
    blocks = p["test_blocks"] or sm_count
    return blocks * p["iters"] if p["test"] == "pc" else blocks * p["threads"]


def strategy() -> Any:
    """Hypothesis strategy over run-time parameter points (see hazards/strategies)."""
    from hazards.strategies.ordering import ordering_points

    return ordering_points(tuple(_BY_NAME))


FAMILY = Family(
    name="ordering",
    summary="memory ordering across blocks: litmus MP/SB/LB/CoRR with incantations, "
            "persistent producer/consumer without acquire/release",
    variants=VARIANTS,
    static_model=static_model,
    strategy=strategy,
    source_dir="ordering",
    binary="ordering",
    platforms=("cuda",),
    default_launches=200,
    timeout_s=30.0,
    runtime_params=RUNTIME_PARAMS,
    # a pc spin that gave up or a litmus slot never written is the rig, not a weak outcome
    harness_anomalies=("spin_timeouts", "invalid"),
)
