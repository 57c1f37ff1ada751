"""Stress a family's variants through the engine: build, serve, run, judge, aggregate.

This module builds the family binary (`hazards.engine.build`), describes a variant as a
`WorkItem` (a request to the family's warm launch server speaking docs/protocol.md, or
`--once` under compute-sanitizer), runs it on the one loop in a leased-campaign frame
(`LeasedCampaign.repeat`), and sums what the replies report (launches, mismatched
launches, litmus instances and weak outcomes) into per-launch rates with confidence
intervals. More in docs/campaigns.md.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from hazards.family import Family, StaticVerdict, Variant
from hazards.engine.campaign import CampaignSummary, LeasedCampaign
from hazards.engine.loop import WorkItem, default_target_factory
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.stall import FAMILY_STALL_S
from hazards.engine.stats import rate_ci
from hazards.engine.evidence import Evidence
from hazards.engine.verdict import Expect, Judgement, Verdict, judge
from hazards.engine import toolchain

KIND = "stress"

def expectation(variant: Variant, oracle: str = "stress", hazardous: bool = False) -> Expect | None:
    """What a correct check must report for this variant under this oracle: DETECT for a
    canary that names the oracle in `detected_by`, CLEAN for a clean variant at a point the
    static model calls safe (`hazardous` False), None (its runs are only counted) otherwise."""
    if variant.is_canary:
        return Expect.DETECT if oracle in variant.detected_by else None
    return None if hazardous else Expect.CLEAN


def preset_expectation(family: Family, variant: Variant, oracle: str = "stress") -> Expect | None:
    """`expectation` at the variant's preset, as the static model judges it: what
    `variant_item` puts on the variant's work item, for the places that name a variant
    without making its item (check's list of GPU variants, its skipped and not-judged rows,
    the dry-run plan)."""
    return expectation(variant, oracle, family.static_model({"variant": variant.name}).hazardous)


def family_binary(family: Family, *, target: str = toolchain.SM90A, defines: dict[str, Any] | None = None) -> Path:
    """Build (or reuse from the cache) the family's binary for `target` (`Family.build_binary`);
    `defines` are extra compile-time -D flags (HZ_PROFILER for a profiled build), part of the key."""
    return family.build_binary(target=target, defines=defines)


def tripwire_names(family: Family) -> str | None:
    """The phase and barrier names of a family whose kernels write tripwire breadcrumbs
    (`standalone/<family>/<family>_names.h`), or None: its server then gets a tripwire file,
    read live as progress (a stall names the layer and phase) and on a hang."""
    from hazards.kernel_sources import family_dir

    path = family_dir(family.source_dir or family.name) / f"{family.name}_names.h"
    return str(path) if path.is_file() else None


def family_timeout(family: Family, sanitizer: str | None = None) -> float:
    """Seconds per request: the family's, scaled for the sanitizer's slowdown."""
    if not sanitizer:
        return family.timeout_s
    from hazards.engine.targets.sanitizer import SLOWDOWN

    return max(120.0, family.timeout_s * SLOWDOWN[sanitizer])


def family_item(family: Family, variant: str | None = None, *, sanitizer: str | None = None,
                build_target: str = toolchain.SM90A, overrides: dict[str, Any] | None = None,
                launches: int | None = None, timeout: float | None = None, respawn_every: int = 0) -> WorkItem:
    """The work item that runs `variant` (None: the family's server for any variant): a
    request of `launches` launches to its warm launch server (`BIN --serve`), or `BIN --once`
    under compute-sanitizer; with what a correct check expects of it and what proves it.
    Builds the binary (or takes it from the build cache)."""
    exe = str(family_binary(family, target=build_target).resolve())
    item = WorkItem(target=f"{family.name}[{sanitizer}]" if sanitizer else family.name,
                    kind="command" if sanitizer else "server", argv=(exe, "--once" if sanitizer else "--serve"),
                    launches=launches or family.default_launches, timeout_s=timeout or family_timeout(family, sanitizer),
                    respawn_every=respawn_every, sanitizer=sanitizer, anomalies=tuple(family.harness_anomalies),
                    # the harness beats while a batch's GPU work completes (docs/stall.md); under a
                    # sanitizer a launch may take far longer than a window: the timeout alone there
                    stall_s=None if sanitizer else FAMILY_STALL_S,
                    tripwire_names=None if sanitizer else tripwire_names(family))
    if variant is None:
        return item
    return variant_item(family, family.variant(variant), item, params={"variant": variant, **(overrides or {})})


def variant_item(family: Family, variant: Variant, base: WorkItem, *, params: dict[str, Any] | None = None,
                 static: StaticVerdict | None = None) -> WorkItem:
    """The one recipe from a family variant to a work item (stress, check, soak): `base`
    (the family's server or `--once` item, `family_item(family)`, or a test double's) aimed
    at `variant` with `params` (default: its name; the server resolves the preset), what a
    correct check must report there (its expectation under base's oracle at the point as
    the static model judges it: `static`, when the caller judged it already) and the
    family's proof."""
    params = dict(params) if params is not None else {"variant": variant.name}
    static = static if static is not None else family.static_model(params)
    expect = expectation(variant, "sanitizer" if base.sanitizer else "stress", static.hazardous)
    return dataclasses.replace(base, target=base.target or family.name, variant=variant.name, params=params,
                               expect=expect.value if expect else None, anomalies=tuple(family.harness_anomalies))


def family_target(family: Family, *, target: str = toolchain.SM90A, sanitizer: str | None = None,
                  respawn_every: int = 0, env: dict[str, str] | None = None) -> Any:
    """A target for the family outside a campaign (the pytest plugin's servers): a warm
    server, or `--once` under compute-sanitizer."""
    return default_target_factory(family_item(family, sanitizer=sanitizer, build_target=target,
                                              respawn_every=respawn_every), dict(env or {}))


@dataclasses.dataclass
class VariantReport:
    """What stressing one variant found."""

    family: str
    variant: str
    role: str
    oracle: str
    static_hazardous: bool
    static_reason: str
    summary: CampaignSummary
    evidence: Evidence  # the runs and their launches, counted as check and soak count them
    wall_s: float
    expected: Expect | None
    judgement: Judgement

    @property
    def verdict(self) -> Verdict:
        return self.judgement.verdict

    def to_json(self) -> dict[str, Any]:
        t = self.evidence
        failed = min(t.failed_launches, t.launches)
        lo, hi = rate_ci(failed, t.launches) if t.launches else (0.0, 1.0)
        d: dict[str, Any] = {
            "family": self.family, "variant": self.variant, "role": self.role,
            "oracle": self.oracle, "expected": self.expected.value if self.expected else "n/a",
            "verdict": self.verdict.value, "message": self.judgement.message,
            "static": {"hazardous": self.static_hazardous, "reason": self.static_reason},
            "campaign": self.summary.to_json(),
            "launches": t.launches, "failed_launches": failed,
            "launch_rate": failed / t.launches if t.launches else None,
            "launch_rate_ci95": [lo, hi], "bad_elements": t.bad_elements,
            "max_rel_err": t.max_rel_err, "kernel_ms": t.kernel_ms, "wall_s": self.wall_s,
            "validated_launches_per_s": t.launches / self.wall_s if self.wall_s > 0 else None,
            "sanitizer_errors": t.sanitizer_errors,
            "attributed_failures": t.proved, "unattributed_failures": t.unproved,
        }
        if t.instances:
            wlo, whi = rate_ci(int(t.weak), int(t.instances))
            d.update(instances=t.instances, weak=t.weak, weak_per_instance=t.weak / t.instances,
                     weak_per_instance_ci95=[wlo, whi])
        return d


def stress_variant(family: Family, variant: str, *, frame: LeasedCampaign, launches: int, requests: int,
                   timeout: float | None = None, sanitizer: str | None = None,
                   overrides: dict[str, Any] | None = None, target: Any = None,
                   build_target: str = toolchain.SM90A,
                   on_result: Callable[[int, RunResult, dict[str, int]], None] | None = None,
                   observer: Any = None) -> VariantReport:
    """Run `requests` batches of `launches` launches of one variant in `frame` (one campaign
    of kind 'stress'); aggregate and judge.

    The family's server stays warm in the frame for the next variant. A ready-made
    `target` (a test double, a prebuilt server) is used instead, and stays the caller's.
    `on_result(seq, result, counts)` hears every run; `observer` (a progress display, a
    `hazards.engine.campaign.RunObserver`) watches the loop.
    """
    v = family.variant(variant)
    params = {"variant": v.name, **(overrides or {})}
    static = family.static_model(params)  # judged once; also refuses a bad override before anything runs
    oracle = "sanitizer" if sanitizer else "stress"
    timeout = timeout or family_timeout(family, sanitizer)
    base = (WorkItem(target=getattr(target, "name", family.name), sanitizer=sanitizer) if target is not None
            else family_item(family, sanitizer=sanitizer, build_target=build_target, launches=launches,
                             timeout=timeout))
    described = variant_item(family, v, base, params=params, static=static)
    item = None if target is not None else described
    expected = described.expectation
    evidence, proves = Evidence(), described.proof
    ran: dict[str, Any] = {}  # the point the binary reports it resolved (metrics.resolved)

    def record(seq: int, result: RunResult, counts: dict[str, int]) -> None:
        evidence.add(result, proves)
        resolved = (result.metrics or {}).get("resolved")
        if not ran and isinstance(resolved, dict):
            ran.update(resolved)
        if on_result is not None:
            on_result(seq, result, counts)

    spec = {"family": family.name, "variant": v.name, "params": params, "launches": launches,
            "requests": requests, "sanitizer": sanitizer, "build_target": build_target,
            "items": [described.to_json()]}
    t0 = time.monotonic()
    summary = frame.repeat(target, item=item, n=requests, timeout=timeout, params=params, launches=launches,
                           kind=KIND, spec=spec, on_result=record, observer=observer,
                           name=f"{family.name}/{v.name}" + (f"[{sanitizer}]" if sanitizer else ""))
    wall = time.monotonic() - t0
    if ran:  # judge what the binary ran, not what we think it resolves to
        static = family.static_model(ran)
    if expectation(v, oracle, static.hazardous) != expected:  # the stored item says what was judged
        expected = expectation(v, oracle, static.hazardous)
        stored = dict(frame.store.campaign(summary.campaign_id).spec)
        stored["items"] = [dataclasses.replace(described, expect=expected.value if expected else None).to_json()]
        frame.store.update_campaign_spec(summary.campaign_id, stored)
    return VariantReport(family.name, v.name, v.role, oracle, static.hazardous, static.reason,
                         summary, evidence, wall, expected, judge(expected, evidence))
