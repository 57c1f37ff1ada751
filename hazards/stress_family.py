"""Stress a family's variants through the engine: build, serve, run, judge, aggregate.

The one loop is `hazards.engine.campaign.run_campaign`; this module only builds the family binary
(`hazards.engine.build`), wraps it as a target (a warm `ServerTarget` speaking docs/protocol.md,
or a `SanitizerTarget` running `--once` under compute-sanitizer), and sums what the
replies report (launches, mismatched launches, litmus instances and weak outcomes) into
per-launch rates with confidence intervals.

Verdict per variant: a canary (role `broken`) must be *detected* by the oracle that ran
(stress, or the sanitizer) when it lists that oracle in `detected_by`; every other
variant must be *clean*. Anything else is reported as MISSED / UNEXPECTED.

A detection counts only when the oracle itself proved the hazard (`is_attributed`): under
the sanitizer, a sanitizer error (not a mismatch or a timeout of the slowed-down kernel);
under stress, a failing run whose harness did not report its own machinery going wrong
(the family's `harness_anomalies`, e.g. ordering's bounded spin that gave up or a result
slot never written; barrier_layout's spin timeouts are its seeded lost release, not one).
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from hazards.family import STANDALONE, Family, Variant
from hazards.engine.build import build_family
from hazards.engine.campaign import CampaignSummary, run_campaign
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.stats import rate_ci
from hazards.engine.store import Store

KIND = "stress"

def is_attributed(result: RunResult, oracle: str, tool: str | None = None,
                  anomalies: tuple[str, ...] = ()) -> bool:
    """Did this run fail *because of the hazard the oracle looks for*?

    sanitizer: only a sanitizer error of `tool` (a kernel mismatch, or a hang of the
    instrumented kernel, proves nothing about races). stress: any hang, fault or mismatch
    whose metrics report none of the family's `anomalies` (`Family.harness_anomalies`:
    counters of the harness's own machinery going wrong, such as ordering's spin timeouts).
    """
    if not Outcome(result.outcome).is_failure:
        return False
    if oracle == "sanitizer":
        from hazards.engine.targets.sanitizer import ERROR_KINDS

        kind = result.error_kind or (result.evidence or {}).get("error_kind")
        wanted = {ERROR_KINDS[tool]} if tool else set(ERROR_KINDS.values())
        return kind in wanted
    m = result.metrics or {}
    return not any(float(m.get(k) or 0) > 0 for k in anomalies)


def family_binary(family: Family, *, target: str = "sm_90a") -> Path:
    """Build (or reuse from the cache) the family's binary for `target`."""
    if not family.binary:
        from hazards.engine.errors import UserError

        raise UserError(f"family {family.name!r} has no runtime binary (static checks only)")
    return build_family(STANDALONE, family.source_dir or family.name, family.binary, target=target)


def family_target(family: Family, *, target: str = "sm_90a", sanitizer: str | None = None,
                  respawn_every: int = 0, env: dict[str, str] | None = None) -> Any:
    """A target for the family: a warm server, or `--once` under compute-sanitizer."""
    from hazards.engine.targets import CommandTarget, ServerTarget

    exe = str(family_binary(family, target=target).resolve())
    if sanitizer:
        from hazards.engine.targets.sanitizer import SanitizerTarget

        return SanitizerTarget(CommandTarget([exe, "--once"], env=env), sanitizer, name=f"{family.name}[{sanitizer}]")

    return ServerTarget([exe, "--serve"], env=env, name=family.name, respawn_every=respawn_every)


@dataclasses.dataclass
class LaunchTally:
    """Per-launch numbers summed over the replies of one campaign."""

    launches: int = 0
    mismatched: int = 0
    bad_elements: int = 0
    kernel_ms: float = 0.0
    instances: float = 0.0
    weak: float = 0.0
    max_rel_err: float = 0.0
    sanitizer_errors: int = 0
    requests: int = 0
    attributed: int = 0  # failing runs the oracle proved (see `is_attributed`)
    unattributed: int = 0  # failing runs it did not: a harness anomaly, a sanitizer-side timeout

    def add(self, result: RunResult, oracle: str = "stress", tool: str | None = None,
            anomalies: tuple[str, ...] = ()) -> None:
        m = result.metrics or {}
        self.requests += 1
        if Outcome(result.outcome).is_failure:
            if is_attributed(result, oracle, tool, anomalies):
                self.attributed += 1
            else:
                self.unattributed += 1
        if result.outcome in (Outcome.CLEAN, Outcome.MISMATCH):
            self.launches += int(m.get("launches") or 0)
            self.mismatched += int(m.get("mismatched") or 0)
            self.bad_elements += int(m.get("bad_elements") or 0)
            self.kernel_ms += float(m.get("kernel_ms") or 0.0)
            self.instances += float(m.get("instances") or 0.0)
            self.weak += float(m.get("weak") or 0.0)
            self.max_rel_err = max(self.max_rel_err, float(m.get("max_rel_err") or 0.0))
        rep = (result.evidence or {}).get("sanitizer") or {}
        self.sanitizer_errors += int(rep.get("errors") or 0)


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
    tally: LaunchTally
    wall_s: float
    expected: str   # "detect" | "clean" | "n/a"
    verdict: str    # "detected" | "clean" | "MISSED" | "UNEXPECTED" | "error" | "n/a"

    def to_json(self) -> dict[str, Any]:
        t = self.tally
        lo, hi = rate_ci(t.mismatched, t.launches) if t.launches else (0.0, 1.0)
        d: dict[str, Any] = {
            "family": self.family, "variant": self.variant, "role": self.role,
            "oracle": self.oracle, "expected": self.expected, "verdict": self.verdict,
            "static": {"hazardous": self.static_hazardous, "reason": self.static_reason},
            "campaign": self.summary.to_json(),
            "launches": t.launches, "mismatched_launches": t.mismatched,
            "launch_rate": t.mismatched / t.launches if t.launches else None,
            "launch_rate_ci95": [lo, hi], "bad_elements": t.bad_elements,
            "max_rel_err": t.max_rel_err, "kernel_ms": t.kernel_ms, "wall_s": self.wall_s,
            "validated_launches_per_s": t.launches / self.wall_s if self.wall_s > 0 else None,
            "sanitizer_errors": t.sanitizer_errors,
            "attributed_failures": t.attributed, "unattributed_failures": t.unattributed,
        }
        if t.instances:
            wlo, whi = rate_ci(int(t.weak), int(t.instances))
            d.update(instances=t.instances, weak=t.weak, weak_per_instance=t.weak / t.instances,
                     weak_per_instance_ci95=[wlo, whi])
        return d


def expectation(variant: Variant, oracle: str, hazardous: bool) -> str:
    """What a correct check must report for this variant under this oracle."""
    if variant.is_canary:
        return "detect" if oracle in variant.detected_by else "n/a"
    return "clean" if not hazardous else "n/a"


def verdict_for(expected: str, summary: CampaignSummary, tally: LaunchTally | None = None) -> str:
    """The variant's verdict. A canary is `detected` only by runs the oracle proved
    (`tally.attributed`); failures for another reason leave it MISSED."""
    if summary.judged == 0:
        return "error"
    if expected == "detect":
        proved = tally.attributed if tally is not None else summary.failures
        return "detected" if proved else "MISSED"
    if expected == "clean":
        return "clean" if not summary.failures else "UNEXPECTED"
    return "detected" if summary.failures else "clean"


def stress_variant(family: Family, variant: str, *, store: Store, launches: int, requests: int,
                   timeout: float | None = None, sanitizer: str | None = None,
                   overrides: dict[str, Any] | None = None, target: Any = None,
                   build_target: str = "sm_90a",
                   on_result: Callable[[int, RunResult, dict[str, int]], None] | None = None,
                   ) -> VariantReport:
    """Run `requests` batches of `launches` launches of one variant; aggregate and judge.

    `target` may be passed to reuse a warm server across variants (the caller closes it).
    """
    v = family.variant(variant)
    params = {"variant": v.name, **(overrides or {})}
    static = family.static_model(params)
    oracle = "sanitizer" if sanitizer else "stress"
    if timeout is None:
        timeout = family.timeout_s
        if sanitizer:
            from hazards.engine.targets.sanitizer import SLOWDOWN

            timeout = max(120.0, family.timeout_s * SLOWDOWN[sanitizer])
    own = target is None
    if own:
        target = family_target(family, target=build_target, sanitizer=sanitizer)
    tally = LaunchTally()

    def record(seq: int, result: RunResult, counts: dict[str, int]) -> None:
        tally.add(result, oracle, sanitizer, family.harness_anomalies)
        if on_result is not None:
            on_result(seq, result, counts)

    spec = {"family": family.name, "variant": v.name, "params": params, "launches": launches,
            "requests": requests, "sanitizer": sanitizer, "build_target": build_target}
    t0 = time.monotonic()
    try:
        summary = run_campaign(target, store, n=requests, timeout=timeout, params=params,
                               launches=launches, kind=KIND, spec=spec,
                               name=f"{family.name}/{v.name}" + (f"[{sanitizer}]" if sanitizer else ""),
                               on_result=record)
    finally:
        if own:
            target.close()
    wall = time.monotonic() - t0
    expected = expectation(v, oracle, static.hazardous)
    return VariantReport(family.name, v.name, v.role, oracle, static.hazardous, static.reason,
                         summary, tally, wall, expected, verdict_for(expected, summary, tally))
