"""How much hang forensics a campaign spends: full, then summaries, within a capped share.

A full collection goes to the first hang of each new stuck location, a cheap summary to the
ones after it, nothing past a capped share of the budget. Every command that runs anything
(run, soak, check, stress, repro) gives its campaign frame a `ForensicsPolicy`; while the
frame's loop runs, the policy is the watchdog's hang policy
(`hazards.engine.watchdog.set_hang_policy`) and the forensics collector is registered. More in
docs/hang-forensics.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from typing import Any, Iterable, Iterator

FULL, SUMMARY, NONE = "full", "summary", "none"
LEVELS = (FULL, SUMMARY, NONE)
DEFAULT_SHARE = 0.10          # of a campaign's budget, for all hangs' collectors together
REPRO_SHARE = 0.50            # `hazards repro`: reading a failure is what it runs for
# Per hang, all collectors together: a cuda-gdb attach to a PyTorch process took 7.3 and
# 10.9 s on the H200 (symbols of torch's libraries), to a plain CUDA program 0.3-0.7 s.
DEFAULT_HANG_BUDGET_S = 20.0
# `hazards check` (pre-merge, its own families' native servers: no torch to attach to).
CHECK_HANG_BUDGET_S = 10.0
MIN_COLLECTION_S = 0.5        # less left of the cap: no collection (a py-spy dump takes 0.2-0.5 s)
PLAN_MARKER = "hz_forensics_plan"
STUCK_PREFIX = "stuck at "    # a located hang's signature message (hazards.engine.signatures)


@dataclasses.dataclass
class HangPlan:
    """What one hang gets (`level`), why, and with how many seconds; the collector reads it
    from `HangContext.plan` and may `upgrade` a summary that found a new stuck location."""

    level: str
    why: str
    budget_s: float
    key: tuple[str, str]
    expect: str | None = None
    policy: "ForensicsPolicy | None" = dataclasses.field(default=None, repr=False)
    upgraded: str | None = None

    def is_new_location(self, stuck_at: str | None) -> bool:
        """True when `stuck_at` (a summary's host location) was never seen for this item."""
        return bool(stuck_at) and self.policy is not None and not self.policy.knows(self.key, stuck_at)

    def upgrade(self, stuck_at: str) -> None:
        """The summary saw a new stuck location: this hang gets the full collection."""
        self.level, self.upgraded = FULL, stuck_at
        self.why = f"a summary found a new stuck location ({stuck_at}): full collection"

    def to_json(self) -> dict[str, Any]:
        return {PLAN_MARKER: 1, "level": self.level, "why": self.why, "budget_s": round(self.budget_s, 3),
                "target": self.key[0], "variant": self.key[1], "expect": self.expect}


def located_messages(messages: Iterable[str]) -> set[str]:
    """The stuck locations named by located-hang signature messages ('stuck at a, b')."""
    out: set[str] = set()
    for m in messages:
        if m.startswith(STUCK_PREFIX):
            out.update(part.strip() for part in m[len(STUCK_PREFIX):].split(", ") if part.strip())
    return out


class ForensicsPolicy:
    """A campaign's hang-forensics policy and its tally (thread-safe: every GPU's loop hangs
    through it). `hang_budget_s`: the most all collectors may take per hang; `share`: the
    most of the campaign's budget all hangs together may take; `known_canary`: what a
    canary whose hang is already located gets (SUMMARY or NONE)."""

    def __init__(self, *, hang_budget_s: float, share: float = DEFAULT_SHARE,
                 known_canary: str = SUMMARY) -> None:
        if not (math.isfinite(hang_budget_s) and hang_budget_s > 0):
            raise ValueError(f"hang budget must be a positive number of seconds, got {hang_budget_s!r}")
        if not 0 < share <= 1:
            raise ValueError(f"forensics share must be in (0, 1], got {share!r}")
        if known_canary not in (SUMMARY, NONE):
            raise ValueError(f"known_canary must be {SUMMARY!r} or {NONE!r}, got {known_canary!r}")
        self.hang_budget_s, self.share, self.known_canary = float(hang_budget_s), float(share), known_canary
        self._mu = threading.Lock()
        self.base_s = 0.0
        self.spent_s = 0.0
        self._reserved: dict[int, float] = {}
        self._known: dict[tuple[str, str], set[str]] = {}
        self._located: set[tuple[str, str]] = set()
        self.counts = {FULL: 0, SUMMARY: 0, NONE: 0}
        self.upgrades = 0
        self._first_full_planned = False
        self._first_full: int | None = None  # id of the first full collection's context while it runs
        self.first_full_s = 0.0              # what it took: the cap is never below it

    # -- campaign ------------------------------------------------------------------------
    def begin(self, base_s: float, store: Any = None) -> None:
        """A campaign (or another loop of the same frame) of `base_s` seconds starts: its
        budget adds to the share's base; the store's located hangs are known from now on."""
        with self._mu:
            self.base_s += max(0.0, base_s if math.isfinite(base_s) else 0.0)
        if store is not None:
            for s in store.signatures():
                if s.outcome == "hang" and s.message.startswith(STUCK_PREFIX):
                    self.learn((s.target, s.variant), located_messages([s.message]))

    @property
    def cap_s(self) -> float:
        """The most all collectors together may take: the share of the base, or what the
        campaign's first full collection took if that was more (it may take one hang budget)."""
        return max(self.share * self.base_s, self.first_full_s)

    def learn(self, key: tuple[str, str], locations: Iterable[str]) -> None:
        """`key`'s hang was located (a full collection, or a stored signature) at `locations`."""
        with self._mu:
            self._located.add(key)
            self._known.setdefault(key, set()).update(x for x in locations if x)

    def knows(self, key: tuple[str, str], location: str) -> bool:
        with self._mu:
            return location in self._known.get(key, set())

    # -- the watchdog's hang policy -----------------------------------------------------
    def plan(self, ctx: Any) -> float:
        """Decide what this hang gets (`ctx.plan`); the seconds its collectors may take (0: none)."""
        run = getattr(ctx, "run", None) or {}
        key = (str(run.get("target", getattr(ctx, "target", "")) or ""), str(run.get("variant", "") or ""))
        expect = run.get("expect")
        with self._mu:
            left = self.cap_s - self.spent_s - sum(self._reserved.values())
            located = key in self._located
            if located and expect == "detect" and self.known_canary == NONE:
                level, why = NONE, "a canary whose hang is already located (its signature is known): no forensics"
            elif not located and not self._first_full_planned:  # the campaign's one look, whatever the share
                level, why, left = FULL, "the first hang of this item: full collection", self.hang_budget_s
                self._first_full_planned, self._first_full = True, id(ctx)
            elif left < MIN_COLLECTION_S:
                level, why = NONE, (f"the forensics cap is spent ({self.cap_s:.1f} s: "
                                    f"{self.share:.0%} of the {self.base_s:.0f} s budget)")
            elif not located:
                level, why = FULL, "the first hang of this item: full collection"
            else:
                level, why = SUMMARY, "this item's hang is already located: summary only (a new location gets the full collection)"
            budget = 0.0 if level == NONE else min(self.hang_budget_s, left)
            self._reserved[id(ctx)] = budget
            self.counts[level] += 1
        ctx.plan = HangPlan(level, why, budget, key, expect, self)
        return budget

    def spent(self, ctx: Any, seconds: float, results: dict[str, Any]) -> None:
        """The collectors of `ctx`'s hang took `seconds`; a hang that got none still gets its hang.md."""
        plan: HangPlan | None = getattr(ctx, "plan", None)
        with self._mu:
            self._reserved.pop(id(ctx), None)
            self.spent_s += max(0.0, seconds)
            if self._first_full == id(ctx):
                self.first_full_s, self._first_full = max(0.0, seconds), None
            if plan is not None and plan.upgraded:
                self.counts[SUMMARY] -= 1
                self.counts[FULL] += 1
                self.upgrades += 1
        if plan is not None and plan.level == NONE:
            from .collector import no_collection
            results["hang_forensics"] = no_collection(ctx, plan)

    # -- what it did -----------------------------------------------------------------------
    @property
    def hangs(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> dict[str, Any]:
        """What a campaign's spec keeps (`forensics`)."""
        with self._mu:
            return {"hangs": self.hangs, "full": self.counts[FULL], "summary": self.counts[SUMMARY],
                    "none": self.counts[NONE], "upgraded": self.upgrades, "spent_s": round(self.spent_s, 3),
                    "base_s": round(self.base_s, 3), "share": self.share, "cap_s": round(self.cap_s, 3),
                    "hang_budget_s": self.hang_budget_s, "known_canary": self.known_canary}

    def words(self) -> str:
        return forensics_words(self.summary())

    @contextlib.contextmanager
    def installed(self, base_s: float, store: Any = None) -> Iterator["ForensicsPolicy"]:
        """Within: this policy decides every hang of this process, and the forensics collector runs."""
        from .collector import hang_forensics, install_hang_collector, uninstall_hang_collector
        from ..watchdog import hang_policy, is_registered, set_hang_policy

        self.begin(base_s, store)
        before, had_collector = hang_policy(), is_registered(hang_forensics)
        set_hang_policy(self)
        install_hang_collector()
        try:
            yield self
        finally:
            set_hang_policy(before)
            if not had_collector:
                uninstall_hang_collector()


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def forensics_words(s: dict[str, Any] | None) -> str | None:
    """'forensics: 3 hangs, 1 full collection, 2 summaries (4.1 s, 4% of the 100 s budget; cap 10%)'
    from a campaign spec's `forensics` (None when it saw no hang)."""
    if not s or not s.get("hangs"):
        return None
    parts = [_plural(s["hangs"], "hang", "hangs"), _plural(s["full"], "full collection", "full collections"),
             _plural(s["summary"], "summary", "summaries")]
    if s.get("none"):
        parts.append(f"{s['none']} without forensics")
    base = s.get("base_s") or 0.0
    used = f"{s['spent_s']:.1f} s, {s['spent_s'] / base:.0%} of the {base:.0f} s budget" if base else \
        f"{s['spent_s']:.1f} s"
    return f"forensics: {', '.join(parts)} ({used}; cap {s['share']:.0%}, the first full collection excepted)"


__all__ = ["FULL", "SUMMARY", "NONE", "LEVELS", "DEFAULT_SHARE", "REPRO_SHARE", "DEFAULT_HANG_BUDGET_S", "CHECK_HANG_BUDGET_S", "PLAN_MARKER", "HangPlan", "ForensicsPolicy",
           "forensics_words", "located_messages"]
