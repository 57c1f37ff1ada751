"""Soak campaigns: every work item on every leased GPU for a time budget, then a comparison.

A soak is one campaign of kind 'soak'. Its spec holds the work items (so `--resume ID`
runs exactly the same set), the budget, the leases and one entry per session; the time
already spent is recomputed from the stored runs, so a soak whose supervisor was
SIGKILLed resumes with the budget it had left. At the end the GPU telemetry summary is
written into the spec and the campaign is compared with the previous soak: new failure
signatures and statistically significant rate changes (one-sided Fisher; Boschloo when
both samples are small enough for it to be cheap) are flagged.

Registered targets come from a TOML file (see `load_targets`). `stress` knows nothing of
the hazard catalog: the `hazards soak` command turns families into `WorkItem`s.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from typing import Any, Callable

from hazards.engine.campaign import LeasedCampaign, RunObserver
from hazards.engine.errors import UserError
from hazards.engine.executor import GpuStats, TargetFactory, WorkItem
from hazards.engine.outcome import RunResult
from hazards.engine.sources import Rotation
from hazards.engine.stats import boschloo, fisher_one_sided
from hazards.engine.store import Signature, Store
from hazards.engine.verdict import Expect, ItemTally, Judgement, campaign_tallies, judge

KIND = "soak"
BOSCHLOO_MAX_N = 200  # scipy's boschloo_exact takes ~0.1 s at n=100 and seconds beyond 1000

_TARGET_KEYS = {"name": str, "kind": str, "argv": list, "cwd": str, "env": dict, "timeout": (int, float),
                "params": dict, "launches": int, "respawn_every": int, "result_regex": str, "variant": str,
                "expect": str}


def load_targets(path: str | os.PathLike[str]) -> list[WorkItem]:
    """Registered targets from a TOML file: one `[[target]]` table per target.

    Keys: name (required), argv (required, list of strings), kind ('command' default, or
    'server'), cwd (relative to the file's folder), env (table of strings), timeout
    (seconds, default 60), params (table), launches (server), respawn_every (server),
    result_regex (command), variant (a label), expect ('clean', the default: any failure is a
    hazard; or 'detect': a canary that must fail). Anything else is a UserError.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"targets file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read targets file {p}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"targets file {p} is not valid TOML: {e}") from None
    tables = data.get("target", [])
    extra = set(data) - {"target"}
    if extra or not isinstance(tables, list) or not tables:
        raise UserError(f"targets file {p}: expected one or more [[target]] tables"
                        + (f" (unknown top-level keys: {', '.join(sorted(extra))})" if extra else ""))
    items, seen = [], set()
    for i, t in enumerate(tables, 1):
        items.append(_target_item(p, i, t))
        if items[-1].key in seen:
            raise UserError(f"targets file {p}: target {items[-1].key!r} is defined twice")
        seen.add(items[-1].key)
    return items


def _target_item(path: Path, index: int, t: Any) -> WorkItem:
    where = f"targets file {path}, target #{index}"
    if not isinstance(t, dict):
        raise UserError(f"{where}: not a table")
    for k, v in t.items():
        if k not in _TARGET_KEYS:
            raise UserError(f"{where}: unknown key {k!r} (known: {', '.join(sorted(_TARGET_KEYS))})")
        if not isinstance(v, _TARGET_KEYS[k]) or isinstance(v, bool):
            raise UserError(f"{where}: {k!r} has the wrong type ({type(v).__name__})")
    name, argv = t.get("name", ""), t.get("argv", [])
    if not name.strip():
        raise UserError(f"{where}: 'name' is required")
    if not argv or not all(isinstance(a, str) and a for a in argv):
        raise UserError(f"{where} ({name}): 'argv' must be a non-empty list of strings")
    kind = t.get("kind", "command")
    if kind not in ("command", "server"):
        raise UserError(f"{where} ({name}): kind must be 'command' or 'server', not {kind!r}")
    timeout = float(t.get("timeout", 60))
    if not timeout > 0:
        raise UserError(f"{where} ({name}): timeout must be > 0")
    if not all(isinstance(v, str) for v in t.get("env", {}).values()):
        raise UserError(f"{where} ({name}): env values must be strings")
    expect = t.get("expect", "clean")
    if expect not in ("clean", "detect"):
        raise UserError(f"{where} ({name}): expect must be 'clean' or 'detect', not {expect!r}")
    cwd = t.get("cwd")
    cwd = str((path.parent / cwd).resolve()) if cwd else None
    return WorkItem(target=name, variant=t.get("variant", ""), expect=expect, kind=kind, argv=tuple(argv),
                    env=dict(t.get("env", {})), cwd=cwd, params=dict(t.get("params", {})),
                    launches=t.get("launches"), timeout_s=timeout, respawn_every=int(t.get("respawn_every", 0)),
                    result_regex=t.get("result_regex"))


# -- comparison with the previous soak ------------------------------------------------------

@dataclasses.dataclass
class RateChange:
    """A target/variant whose failure rate changed significantly between two campaigns."""

    target: str
    variant: str
    k_before: int
    n_before: int
    k_after: int
    n_after: int
    direction: str  # "rose" | "dropped"
    p: float
    test: str
    verdict: str


@dataclasses.dataclass
class CampaignComparison:
    """What changed since the previous campaign of the same kind."""

    current_id: int
    previous_id: int
    new_signatures: list[Signature]
    changes: list[RateChange]

    @property
    def regressed(self) -> bool:
        """New failure signatures, or a failure rate that rose significantly."""
        return bool(self.new_signatures) or any(c.direction == "rose" for c in self.changes)


def previous_campaign(store: Store, campaign_id: int) -> int | None:
    """The latest earlier campaign of the same kind that stored runs, if any."""
    kind = store.campaign(campaign_id).kind
    earlier = [c.id for c in store.campaigns(kind) if c.id < campaign_id and store.run_count(c.id)]
    return earlier[-1] if earlier else None


def _one_sided(k1: int, n1: int, k2: int, n2: int) -> tuple[float, str]:
    """p for "rate 1 > rate 2": Boschloo when cheap, Fisher otherwise."""
    if max(n1, n2) <= BOSCHLOO_MAX_N:
        return boschloo(k1, n1, k2, n2), "Boschloo"
    return fisher_one_sided(k1, n1, k2, n2), "Fisher"


def compare_campaigns(store: Store, current_id: int, previous_id: int | None = None, *,
                      alpha: float = 0.05) -> CampaignComparison | None:
    """Compare a campaign with the previous one of its kind (None when there is none)."""
    if previous_id is None:
        previous_id = previous_campaign(store, current_id)
    if previous_id is None:
        return None
    before_keys = {s.key for s in store.signatures(previous_id)}
    new = [s for s in store.signatures(current_id) if s.key not in before_keys]
    before = {(t.target, t.variant): t for t in store.tally(previous_id)}
    changes = []
    for t in store.tally(current_id):
        b = before.get((t.target, t.variant))
        if b is None or not b.judged or not t.judged:
            continue
        p_rose, test = _one_sided(t.failures, t.judged, b.failures, b.judged)
        p_drop, _ = _one_sided(b.failures, b.judged, t.failures, t.judged)
        for direction, p in (("rose", p_rose), ("dropped", p_drop)):
            if p < alpha:
                changes.append(RateChange(
                    t.target, t.variant, b.failures, b.judged, t.failures, t.judged, direction, p, test,
                    f"failure rate {direction} from {b.failures}/{b.judged} to {t.failures}/{t.judged}"
                    f" (one-sided {test} p={p:.2g})"))
    return CampaignComparison(current_id, previous_id, new, changes)


# -- the soak itself --------------------------------------------------------------------------

@dataclasses.dataclass
class SoakResult:
    """How a soak session ended."""

    campaign_id: int
    status: str
    gpu_stats: list[GpuStats]
    spent_s: float
    budget_s: float
    comparison: CampaignComparison | None
    dropped: dict[str, str]
    expectations: dict[str, Expect | None]
    judgements: dict[str, Judgement]

    @property
    def blind(self) -> list[str]:
        """Canaries that were not detected: went blind, or never judged (the budget ended
        before they ran, or only errors), which must be flagged too, never pass unseen."""
        return [k for k, e in self.expectations.items() if e is Expect.DETECT and not self.judgements[k].ok]

    def canary_lines(self) -> list[str]:
        """One verdict line per canary that was not detected."""
        return [self.judgements[k].line(k, Expect.DETECT) for k in self.blind]

    @property
    def flagged(self) -> bool:
        """Regressions against the previous soak, canaries that went blind, dropped items."""
        return bool((self.comparison and self.comparison.regressed) or self.blind or self.dropped)


def spent_seconds(store: Store, campaign_id: int) -> float:
    """Budget already used by a campaign's sessions, from its stored runs.

    Each session starts at `spec["sessions"][i]["started"]` and lasted until the end of its
    last stored run (a killed session counts up to its last committed run).
    """
    starts = sorted(s["started"] for s in store.campaign(campaign_id).spec.get("sessions", []))
    if not starts:
        return 0.0
    ends = [0.0] * len(starts)
    for sr in store.iter_runs(campaign_id):
        end = (sr.result.started_at or 0.0) + (sr.result.duration_s or 0.0)
        i = max((j for j, s in enumerate(starts) if s <= (sr.result.started_at or 0.0)), default=None)
        if i is not None:
            ends[i] = max(ends[i], end)
    return sum(max(0.0, e - s) for s, e in zip(starts, ends))


def stored_time(store: Store, campaign_id: int) -> dict[str, tuple[int, float]]:
    """{item key: (runs, seconds of run time)} already stored for a campaign."""
    out: dict[str, tuple[int, float]] = {}
    for sr in store.iter_runs(campaign_id):
        r = sr.result
        key = r.key
        n, s = out.get(key, (0, 0.0))
        out[key] = (n + 1, s + max(0.0, r.duration_s or 0.0))
    return out


def start_or_resume(frame: LeasedCampaign, items: list[WorkItem] | None, *, budget_s: float, resume: int | None,
                    spec_extra: dict[str, Any] | None = None, name: str | None = None) -> tuple[int, list[WorkItem], float]:
    """Create the soak campaign in `frame` (or reopen `resume`); returns (id, items, budget left)."""
    if resume is None:
        if not items:
            raise UserError("nothing to soak: no families with a launch server and no --targets")
        spec = {"budget_s": budget_s, "items": [i.to_json() for i in items], **(spec_extra or {})}
        return frame.create(KIND, spec, name=name), items, budget_s
    camp = frame.store.campaign(resume)
    if camp.kind != KIND:
        raise UserError(f"campaign {resume} is a {camp.kind!r} campaign, not a soak")
    stored = [WorkItem.from_json(d) for d in camp.spec.get("items", [])]
    if not stored:
        raise UserError(f"campaign {resume} has no work items to resume")
    left = float(camp.spec.get("budget_s", 0.0)) - spent_seconds(frame.store, resume)
    frame.reopen(resume, KIND)
    return resume, stored, max(0.0, left)


def run_soak(frame: LeasedCampaign, items: list[WorkItem] | None, *, budget_s: float,
             resume: int | None = None, name: str | None = None, spec_extra: dict[str, Any] | None = None,
             on_result: Callable[[int, WorkItem, RunResult], None] | None = None,
             target_factory: TargetFactory | None = None, observer: RunObserver | None = None) -> SoakResult:
    """Run (or resume) one soak campaign on the frame's leases and compare it with the previous
    soak; `observer` (a progress display) watches the loop."""
    store = frame.store
    cid, items, left = start_or_resume(frame, items, budget_s=budget_s, resume=resume, spec_extra=spec_extra,
                                       name=name)
    source = Rotation(items, stored_time(store, cid))
    stats = frame.run(cid, source, budget_s=left, target_factory=target_factory, on_result=on_result,
                      observer=observer)
    status = store.campaign(cid).status
    dropped = source.dropped()
    tallies = campaign_tallies(store, cid, {i.key: i.proof for i in items})
    judgements = {i.key: judge(i.expectation, tallies.get(i.key, ItemTally()), dropped=dropped.get(i.key))
                  for i in items}
    return SoakResult(cid, status, stats, spent_seconds(store, cid), float(store.campaign(cid).spec["budget_s"]),
                      compare_campaigns(store, cid), dropped, {i.key: i.expectation for i in items}, judgements)
