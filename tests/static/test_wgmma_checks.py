"""The wgmma pipeline checks (hazards/static/wgmma.py): on the compiled mma_pingpong kernels
(broken flagged, fixed clean, the family's strategy points as the model predicts) and on
small listings for what ptxas never emits."""
from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings

from hazards.families import mma_pingpong
from hazards.static import checks, sass, wgmma
from hazards.static.compile import compile_cubin
from hazards.static_catalog import check_catalog
from static_helpers import DATA, failing_ids, requires_nvdisasm, sass_listing


@pytest.fixture(scope="module")
def compiled():
    """shape -> (build, listing, functions) of the family source built for that shape (one
    nvcc -cubin per shape, shared by every test)."""
    return lambda shape="128x64": mma_pingpong._compiled(
        str(mma_pingpong.SOURCE), mma_pingpong.SOURCE.stat().st_mtime, shape)


def _function(compiled, **params):
    sym = mma_pingpong.kernel_symbol(params)
    (func,) = [f for f in compiled(mma_pingpong.FAMILY.resolve(params)["shape"])[2] if sym in f.name]
    return func


@requires_nvdisasm
@pytest.mark.parametrize("variant", [v.name for v in mma_pingpong.FAMILY.variants])
def test_each_variant_triggers_exactly_the_checks_its_role_and_schedule_predict(variant):
    got = failing_ids(mma_pingpong.static_check({"variant": variant}))
    assert got == mma_pingpong.predicted_checks({"variant": variant})
    v = mma_pingpong.FAMILY.variant(variant)
    assert bool(got) is ("static" in v.detected_by)  # broken_tail is a run-time hazard only


@requires_nvdisasm
def test_the_catalog_detects_both_static_canaries_and_passes_the_clean_variants():
    found = check_catalog(["mma_pingpong"])
    assert not [f for f in found if f.fails], [f.format() for f in found if f.fails]
    detected = {f.subject for f in found if f.check == "canary-detected"}
    assert detected == {"mma_pingpong/broken_war", "mma_pingpong/broken_war_threads",
                        "mma_pingpong/broken_acc_read"}


@requires_nvdisasm
@pytest.mark.parametrize("wait, banks", [(w, s) for w in range(4) for s in range(1, 5)])
def test_refill_depth_read_from_sass_equals_the_compiled_wait_depth(compiled, wait, banks):
    func = _function(compiled, shape="256x64", stages=max(banks, 1), wait_depth=wait)
    found = wgmma.check_function(func, "x.sass", banks=banks)
    assert {f.check for f in found if f.fails} == ({"wgmma-refill-in-flight"} if wait >= banks else set())
    if wait < banks:
        (info,) = [f for f in found if f.check == "wgmma-refill-depth"]
        assert f"at most {wait} wgmma group(s) in flight" in info.message


@requires_nvdisasm
@pytest.mark.parametrize("wait, banks", [(1, 1), (1, 2), (0, 1)])
def test_thread_store_refills_are_judged_like_bulk_copies_when_the_caller_names_them(compiled, wait, banks):
    func = _function(compiled, stages=banks, wait_depth=wait, refill="threads")
    assert sum(ins.base == "STS" for ins in func.instrs) == 12  # 24 KB bank / (128 threads x 16 B)
    got = failing_ids(wgmma.check_function(func, "x.sass", banks=banks, store_refills=True))
    assert got == ({"wgmma-refill-in-flight"} if wait >= banks else set())
    assert not failing_ids(wgmma.check_function(func, "x.sass", banks=banks))  # the bulk prologue: depth 0


@requires_nvdisasm
def test_the_group_left_in_flight_by_the_broken_wait_holds_real_wgmmas(compiled):
    """The last repetition of a tile's batch is straight-line before the commit, so ptxas
    closes the group on a real wgmma, not on an empty commit after the run-time loop."""
    func = _function(compiled, stages=1, wait_depth=1)
    states = wgmma.in_flight(func)
    at_refill = [s for i, s in enumerate(states) if s and wgmma.is_smem_refill(func.instrs[i]) and s.depth]
    assert at_refill and all(s.reading_depth == 1 for s in at_refill)


@requires_nvdisasm
def test_ptxas_serializes_the_early_accumulator_read_so_no_group_is_in_flight_at_refills(compiled):
    func = _function(compiled, stages=1, wait_depth=1, acc_read="before_wait")
    states = wgmma.in_flight(func)
    depths = [s.depth for i, s in enumerate(states) if s and wgmma.is_smem_refill(func.instrs[i])]
    assert depths and max(depths) == 0  # the same schedule without the read is depth 1
    early = wgmma.check_ptxas_log(compiled()[0].log, "x.cu", functions=[mma_pingpong.kernel_symbol(
        {"stages": 1, "wait_depth": 1, "acc_read": "before_wait"})])
    assert [f.check for f in early] == ["wgmma-early-access"] and "C7514" in early[0].message


@requires_nvdisasm
def test_removing_the_retiring_depbar_from_real_sass_exposes_the_accumulator_read(compiled):
    """A mutation of ptxas' own output: the DEPBARs after the tail's last HGMMA become NOPs,
    so the epilogue's stores read accumulators of a group still in flight."""
    import dataclasses

    func = _function(compiled, stages=2, wait_depth=1)
    assert not failing_ids(wgmma.check_function(func, "x.sass", banks=2))
    last = max(i for i, ins in enumerate(func.instrs) if wgmma.is_wgmma(ins))
    nop = [dataclasses.replace(ins, opcode="NOP", operands=[], text="NOP")
           if i > last and "DEPBAR" in ins.opcode else ins for i, ins in enumerate(func.instrs)]
    mutated = sass.SassFunction(func.name, nop, func.labels)
    (hit,) = [f for f in wgmma.check_function(mutated, "x.sass", banks=2)
              if f.check == "wgmma-register-in-flight"]
    assert hit.severity == "error" and "STG" in hit.message


@requires_nvdisasm
def test_register_a_rewritten_in_flight_is_serialized_by_ptxas_c7513():
    build = compile_cubin(DATA / "wgmma_rs_rewrite.cu", label="wgmma-rs-rewrite")
    found = wgmma.check_ptxas_log(build.log, "wgmma_rs_rewrite.cu")
    assert [f.check for f in found] == ["wgmma-early-access"] and "C7513" in found[0].message
    listing = sass.disassemble(build.path)
    assert not failing_ids(wgmma.check_sass(listing.text, str(listing.path)))  # ptxas made it safe


@requires_nvdisasm
def test_every_sass_check_over_a_family_cubin_is_clean_without_a_ring_size(compiled):
    found = sass.check_sass(compiled()[1].text, "x.sass")
    assert not [f.format() for f in found if f.fails]
    assert {f.check for f in found} == {"wgmma-refill-depth"}


FEW = settings(max_examples=20, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow])


@requires_nvdisasm
@FEW
@given(mma_pingpong.strategy())
def test_strategy_points_trigger_the_checks_the_model_predicts(params):
    assert failing_ids(mma_pingpong.static_check(params)) == mma_pingpong.predicted_checks(params)


# ------------------------------------------------------------------ small listings --
PIPE = """
HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;
HGMMA.64x64x16.F32.BF16 R24, gdesc[UR10], R24, gsb0
{wait}
UBLKCP.S.G [UR6], [UR22], UR9
{read}
WARPGROUP.DEPBAR.LE gsb0, 0x0
STG.E desc[UR4][R2.64], R30
EXIT
"""


@pytest.mark.parametrize("wait, banks, refill", [
    ("", 1, True), ("", 2, False), ("WARPGROUP.DEPBAR.LE gsb0, 0x1", 1, True),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x1", 2, False), ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 1, False),
])
def test_a_refill_is_judged_by_the_groups_pending_before_it_and_the_ring_size(wait, banks, refill):
    text = sass_listing(PIPE.format(wait=wait, read=""))
    got = failing_ids(wgmma.check_sass(text, "k.sass", banks=banks))
    assert got == ({"wgmma-refill-in-flight"} if refill else set())


@pytest.mark.parametrize("store_refills", [True, False])
def test_a_thread_store_is_a_refill_only_when_the_caller_says_the_ring_is_refilled_by_stores(store_refills):
    text = sass_listing(PIPE.format(wait="", read="").replace("UBLKCP.S.G [UR6], [UR22], UR9", "STS.128 [R2], R100"))
    got = failing_ids(wgmma.check_sass(text, "k.sass", banks=1, store_refills=store_refills))
    assert got == ({"wgmma-refill-in-flight"} if store_refills else set())


OUT_OF_LINE_REFILL = """
HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;
HGMMA.64x64x16.F32.BF16 R24, gdesc[UR10], R24, gsb0
{wait}
CALL.REL.NOINC `($k$refill)
WARPGROUP.DEPBAR.LE gsb0, 0x0
STG.E desc[UR4][R2.64], R30
EXIT
$k$refill:
UBLKCP.S.G [UR6], [UR22], UR9
RET.REL.NODEC R20 `(k)
"""


@pytest.mark.parametrize("wait, refill", [("", True), ("WARPGROUP.DEPBAR.LE gsb0, 0x0", False)])
def test_a_refill_in_an_out_of_line_function_is_judged_by_the_groups_its_caller_left_pending(wait, refill):
    # the callee is reached only by the CALL: the dataflow from the entry alone never saw its refill
    text = sass_listing(OUT_OF_LINE_REFILL.format(wait=wait))
    got = failing_ids(wgmma.check_sass(text, "k.sass", banks=1))
    assert got == ({"wgmma-refill-in-flight"} if refill else set())


EMPTY_COMMIT = """
HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;
HGMMA.64x64x16.F32.BF16 R24, gdesc[UR10], R24, gsb0
{commit}
WARPGROUP.DEPBAR.LE gsb0, 0x1
UBLKCP.S.G [UR6], [UR22], UR9
WARPGROUP.DEPBAR.LE gsb0, 0x0
STG.E desc[UR4][R2.64], R30
EXIT
"""


@pytest.mark.parametrize("commit, refill", [
    ("HGMMA.64x8x16.F16 RZ, gdesc[URZ], RZ, !UPT, gsb0", False),  # the empty commit is what stays pending
    ("", True),                                                     # the real group stays pending
])
def test_a_wait_that_leaves_only_an_empty_commit_pending_has_retired_the_real_wgmmas(commit, refill):
    text = sass_listing(EMPTY_COMMIT.format(commit=commit))
    assert failing_ids(wgmma.check_sass(text, "k.sass", banks=1)) == ({"wgmma-refill-in-flight"} if refill else set())


def test_a_refill_is_only_described_when_the_ring_size_is_unknown():
    found = wgmma.check_sass(sass_listing(PIPE.format(wait="", read="")), "k.sass")
    assert [f.check for f in found] == ["wgmma-refill-depth"]
    assert "more than 1 operand buffers" in found[0].message and not found[0].fails


@pytest.mark.parametrize("read, flagged", [
    ("FADD R40, R55, R55", True),                # R55: last accumulator of a 64-wide tile (R24..R55)
    ("MOV R31, RZ", True),                       # a write into an accumulator in flight
    ("STG.E.128 desc[UR4][R2.64], R20", False),  # R20..R23: just below the accumulators
    ("FADD R56, R57, R58", False),               # just past them
])
def test_touching_registers_of_a_pending_group_is_flagged(read, flagged):
    text = sass_listing(PIPE.format(wait="", read=read))
    assert ("wgmma-register-in-flight" in failing_ids(wgmma.check_sass(text, "k.sass", banks=2))) is flagged


def test_a_store_vector_reaching_into_the_accumulators_is_flagged():
    text = sass_listing(PIPE.format(wait="", read="STG.E.128 desc[UR4][R2.64], R22"))  # R22..R25
    assert "wgmma-register-in-flight" in failing_ids(wgmma.check_sass(text, "k.sass", banks=2))


def test_the_new_check_ids_are_registered_with_their_severities():
    assert checks.get("wgmma-proxy-fence").severity == "error" and checks.get("wgmma-proxy-fence").also == ("info",)
    assert checks.get("wgmma-refill-in-flight").severity == "error"
    assert checks.get("wgmma-register-in-flight").severity == "error"
    assert checks.get("wgmma-early-access").severity == "warning"
    assert checks.get("wgmma-refill-depth").severity == "info"
    assert re.search(r"C7513-C7515", checks.get("wgmma-early-access").doc)


def _proxy_fence_findings(fenced: bool, store_refills: bool):
    build = compile_cubin(DATA / "wgmma_proxy_fence.cu", defines=None if fenced else {"HZ_NO_PROXY_FENCE": 1},
                          label=f"wgmma-proxy-fence-{fenced}")
    listing = sass.disassemble(build.path)
    return [f for f in wgmma.check_sass(listing.text, str(listing.path), store_refills=store_refills)
            if f.check == "wgmma-proxy-fence"]


@requires_nvdisasm
def test_thread_stores_read_by_a_wgmma_need_the_proxy_fence_between():
    assert _proxy_fence_findings(fenced=True, store_refills=True) == []
    (hit,) = _proxy_fence_findings(fenced=False, store_refills=True)
    assert hit.severity == "error" and "STS" in hit.message and "FENCE.VIEW.ASYNC" in hit.message
    # without the caller's word that the stores refill wgmma operands, the store may be to
    # memory no wgmma reads: said, not failed
    (quiet,) = _proxy_fence_findings(fenced=False, store_refills=False)
    assert quiet.severity == "info" and not quiet.fails


@requires_nvdisasm
def test_the_mutation_rounds_proxy_fence_survivor_is_flagged_by_the_family_check(compiled, tmp_path):
    # `hazards mutate`'s remove-fence of mma_pingpong's fence.proxy.async survived every run
    # (no run can show it); the family's static check now sees it on fixed_threads' kernel
    import shutil

    from hazards.kernel_sources import standalone_dir
    from hazards.mutate.catalog import build_defines, language
    from hazards.mutate.mutants import check_operators, mutants_of

    source = standalone_dir() / "mma_pingpong" / "mma_pingpong.cu"
    text, mutants = mutants_of(source, operators=check_operators(["remove-fence"]),
                               defines=build_defines("mma_pingpong"), language=language("mma_pingpong"))
    (mutant,) = [m for m in mutants if "fence.proxy.async" in m.description]
    shutil.copytree(standalone_dir(), tmp_path / "standalone")
    mutated = tmp_path / "standalone" / "mma_pingpong" / "mma_pingpong.cu"
    mutated.write_text(mutant.apply(text))
    point = mma_pingpong.FAMILY.resolve({"variant": "fixed_threads"})
    build = compile_cubin(mutated, defines={"HZ_MMA_SHAPES": 1 << mma_pingpong.SHAPES.index(point["shape"])},
                          label="mma_pingpong-no-proxy-fence")
    (func,) = [f for f in sass.parse_sass(sass.disassemble(build.path).text)
               if mma_pingpong.kernel_symbol(point) in f.name]
    found = wgmma.check_function(func, "mutant.sass", banks=point["stages"], store_refills=True)
    assert failing_ids(found) == {"wgmma-proxy-fence"}
    original = _function(compiled, variant="fixed_threads")
    assert not failing_ids(wgmma.check_function(original, "x.sass", banks=point["stages"], store_refills=True))
