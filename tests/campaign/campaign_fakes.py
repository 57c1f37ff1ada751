"""Helpers for the campaign tests: a fake family served by the fake server (tests/fakes)."""
from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import strategies as st

from hazards.family import Family, Param, StaticVerdict, Variant
from hazards.engine.loop import WorkItem

HERE = Path(__file__).resolve().parent
FAKE_SERVER = HERE.parent / "fakes" / "fake_server.py"


def make_family(name: str = "fakefam", *, canary_fail_prob: float = 1.0, clean_fail_prob: float = 0.0,
                extra: tuple[Variant, ...] = ()) -> Family:
    """A family with a reference, a fixed and a broken (canary) variant served by the fake server."""
    return Family(
        name=name, summary="fake family for tests",
        variants=(
            Variant("reference", "reference", "the reference", params={"fail_prob": 0.0}),
            Variant("fixed", "fixed", "the fix", params={"fail_prob": clean_fail_prob}),
            Variant("broken", "broken", "seeded hazard", params={"fail_prob": canary_fail_prob},
                    detected_by=("stress",)),
        ) + extra,
        static_model=lambda p: StaticVerdict(p.get("variant") == "broken", "fake"),
        strategy=lambda: None, binary="fakefam", timeout_s=10.0)


def fake_items_for(family: Family, variants: list[Variant]) -> list[WorkItem]:
    """Work items that run each variant on the fake family server."""
    return [WorkItem(target=family.name, variant=v.name, kind="server", argv=(sys.executable, str(FAKE_SERVER)),
                     params={"variant": v.name, **v.params}, launches=10, timeout_s=10.0)
            for v in variants]


def synthetic_soaks(store, *, n: int = 60) -> tuple[int, int]:
    """Two stored soak campaigns (ids returned: previous, current) with runs on two GPUs.

    The current one has a new failure signature (a hang in ordering/fixed) and a failure
    rate of pipeline/fixed that rose from 0/n to n/3; GPU-bbbb logged Xid 48 and ECC errors.
    """
    import random

    from hazards.engine.outcome import Outcome, RunResult

    rng = random.Random(7)
    items = [{"target": "pipeline", "variant": "broken", "role": "canary"},
             {"target": "pipeline", "variant": "fixed", "role": "clean"},
             {"target": "ordering", "variant": "fixed", "role": "clean"}]
    ids = []
    for night in range(2):
        spec = {"budget_s": 300, "items": items,
                "telemetry": {"GPU-bbbb": {"name": "Fake H200", "xid_watch": "on",
                                           "xids": [{"t": 0, "xid": 48}] if night else [],
                                           "sm_mhz_min": 1755, "sm_mhz_max": 1980}}}
        cid = store.create_campaign("soak", spec, name=f"night {night}")
        t = 1_700_000_000.0 + night * 86400
        for i in range(n):
            for item in items:
                uuid = "GPU-aaaa" if i % 2 else "GPU-bbbb"
                outcome, reason = Outcome.CLEAN, "ok"
                if item["variant"] == "broken" and rng.random() < 0.5:
                    outcome, reason = Outcome.MISMATCH, "10 of 10 launches mismatched"
                if night and item["target"] == "pipeline" and item["variant"] == "fixed" and i % 3 == 0:
                    outcome, reason, uuid = Outcome.MISMATCH, "10 of 10 launches mismatched", "GPU-bbbb"
                if night and item["target"] == "ordering" and i == 5:
                    outcome, reason = Outcome.HANG, "no reply within 10 s"
                tel = {"uuid": uuid, "driver": "580.fake", "sm_mhz": 1980, "temp_c": 40 + i % 7, "power_w": 300.0,
                       "throttle": [], "xids": [48] if (night and i == 3 and uuid == "GPU-bbbb") else [],
                       "ecc_corrected": 1 if (night and i == 9 and uuid == "GPU-bbbb") else 0, "ecc_uncorrected": 0}
                store.record_run(cid, RunResult(
                    outcome, reason, target=item["target"], variant=item["variant"], params={"variant": item["variant"]},
                    metrics={"launches": 10, "kernel_ms": rng.uniform(0.05, 0.5)}, evidence={"telemetry": tel},
                    started_at=t, duration_s=0.05, gpu_uuid=uuid))
                t += 0.05
        store.set_campaign_status(cid, "complete")
        ids.append(cid)
    return ids[0], ids[1]


# -- a fake family with a parameter space (explore) ------------------------------------------

LAUNCHES = 4


def knob_family(model_from: int, rate: float | None = 1.0, *, zero_from: int | None = None) -> Family:
    """A family with one int parameter; the model calls knob >= model_from hazardous with
    `rate` per launch (and knob >= zero_from hazardous at rate 0: only elsewhere)."""
    def model(params):
        p = fam.resolve(params)
        if zero_from is not None and p["knob"] >= zero_from:
            return StaticVerdict(True, "hazardous on another platform", 0.0)
        if p["knob"] >= model_from:
            return StaticVerdict(True, f"knob {p['knob']} >= {model_from}", rate)
        return StaticVerdict(False, f"knob {p['knob']} < {model_from}", 0.0)

    fam = Family(name="knobfam", summary="fake", binary="knobfam", default_launches=LAUNCHES,
                 variants=(Variant("fixed", "fixed", "the fix"),
                           Variant("broken", "broken", "seeded", params={"knob": 1000}, detected_by=("stress",))),
                 params=(Param("knob", "int", 0, "a knob", 0, 1000),),
                 static_model=model,
                 strategy=lambda: st.fixed_dictionaries({"variant": st.just("fixed"), "knob": st.integers(0, 1000)}))
    return fam


def fake_item_for(fails_from: int, **extra: object):
    """The fake 'kernel': every launch of a point with knob >= fails_from mismatches."""
    def item_for(point):
        return WorkItem(target="knobfam", variant=f"explore:{point.get('variant', 'fixed')}", kind="server",
                        argv=(sys.executable, str(FAKE_SERVER)),
                        params={**point, "fail_from": {"knob": fails_from}, **extra}, launches=LAUNCHES,
                        timeout_s=10.0)
    return item_for


