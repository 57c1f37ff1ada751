"""On a GPU: `hazards check` machinery against a real family, with one canary made harmless
on purpose (the fixture applies the fix through the variant's run-time parameters)."""
from __future__ import annotations

import pytest

from hazards.checkrun import default_items_for, run_check
from hazards.families import get_family
from hazards.engine.gpus import gpu_available
from hazards.engine.store import Store

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no usable NVIDIA GPU (NVML/nvidia-smi found none)")]

HARMLESS = {"war_barrier": True}  # pipeline/broken_war with its WAR barrier put back


def harmless_broken_war(family, variants):
    """The real work items, except that broken_war runs with the barrier it lacks."""
    items = default_items_for(family, variants)
    for item in items:
        if item.variant == "broken_war":
            item.params.update(HARMLESS)
    return items


def test_pipeline_check_passes_and_a_harmless_canary_went_blind(tmp_path):
    fam = get_family("pipeline")
    assert fam.static_model({"variant": "broken_war"}).hazardous
    assert not fam.static_model({"variant": "broken_war", **HARMLESS}).hazardous  # the fixture is harmless
    with Store(tmp_path / "r.db") as store:
        # a private lease folder: a pytest plugin may hold this GPU's lease in .hazards/leases.
        # 30 s each: the check spends its whole budget (canaries first, until each is detected
        # or its SPRT accepts it blind); at 120 s each the test ran past the suite's budget.
        good = run_check(budget_s=30, catalog=[fam], store=store, lock_dir=str(tmp_path / "leases"), wait_s=0)
        bad = run_check(budget_s=30, catalog=[fam], store=store, lock_dir=str(tmp_path / "leases"), wait_s=0,
                        items_for=harmless_broken_war)
    assert all(v.ok for v in good.verdicts), "\n".join(good.summary_lines())
    assert {v.variant: v.status for v in good.verdicts if v.role == "canary"} == {
        "broken_war": "detected", "broken_wait": "detected", "broken_tail": "detected"}
    assert bad.exit_code == 1
    assert [v.variant for v in bad.blind] == ["broken_war"], "\n".join(bad.summary_lines())
    assert bad.blind[0].line().startswith("FAIL pipeline/broken_war [canary] went blind: ")
