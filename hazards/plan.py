"""What `hazards soak` and `hazards check` would do, said before anything runs (`--dry-run`).

A plan is built from the same validation a real run does first (families, variants, the
targets file, `--skip`, a resumed campaign), so a plan that prints is a command that would
start; nothing is built, leased, run or stored, and no GPU is needed. It lists the work
items with what each must show (a canary must be detected, a clean variant must stay
clean), how the budget would be spent, and what would be skipped or could not be judged
and why.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable

from hazards.engine.errors import ToolchainMissing, UserError
from hazards.family import Family


@dataclasses.dataclass
class PlannedItem:
    """One work item: `key` (target/variant), what runs it, and what it must show."""

    key: str
    runs_as: str  # "family launch server", "command", "server"
    expect: str   # "detect (canary)", "clean", "counted only"
    timeout_s: float | None = None


@dataclasses.dataclass
class Plan:
    """What a command would run: items, the budget's use, what would be skipped (and why)."""

    command: str
    items: list[PlannedItem]
    budget: list[str]
    skipped: list[tuple[str, str]]  # (what, why)
    gpus: list[str]
    without_gpu: str  # what a real run does when no GPU is visible
    notes: list[str] = dataclasses.field(default_factory=list)

    def lines(self) -> list[str]:
        """The plan as text, one fact a line."""
        from hazards.cli.progress import format_duration

        out = [f"hazards {self.command} --dry-run: nothing is built, leased, run or stored"]
        out.append(f"items ({len(self.items)}):")
        for i in self.items:
            limit = f", timeout {format_duration(i.timeout_s)}" if i.timeout_s else ""
            out.append(f"  {i.key}: {i.expect}; runs as {i.runs_as}{limit}")
        out.append("budget:")
        out += [f"  {b}" for b in self.budget]
        out.append(f"skipped ({len(self.skipped)}):" if self.skipped else "skipped: nothing")
        out += [f"  {what}: {why}" for what, why in self.skipped]
        out.append(f"GPUs visible now: {', '.join(self.gpus)}" if self.gpus else
                   f"GPUs visible now: none: {self.without_gpu}")
        out += self.notes
        return out

    def to_json(self) -> dict[str, Any]:
        return {"command": self.command, "dry_run": True, "items": [dataclasses.asdict(i) for i in self.items],
                "budget": self.budget, "skipped": [{"what": w, "why": y} for w, y in self.skipped],
                "gpus": self.gpus, "without_gpu": self.without_gpu, "notes": self.notes}


def _expect_label(expect: str | None) -> str:
    return {"detect": "must be detected (canary)", "clean": "must stay clean"}.get(expect or "", "counted only")


def _visible_gpus() -> list[str]:
    from hazards.engine.leases import lease_candidates

    return [str(gpu) for gpu, _ in lease_candidates()]


def _family_items(fam: Family, variants: Iterable[Any]) -> list[PlannedItem]:
    from hazards.stress_family import preset_expectation

    out = []
    for v in variants:
        expect = preset_expectation(fam, v)
        out.append(PlannedItem(f"{fam.name}/{v.name}", "family launch server", _expect_label(
            expect.value if expect else None), fam.timeout_s))
    return out


def _launch_servers_unbuildable(fams: list[Family], consequence: str) -> list[tuple[str, str]]:
    """A skipped line when the compiler of the families' launch servers is missing (a plan
    that said "skipped: nothing" there would hide what stops the real command)."""
    from hazards.engine import toolchain
    from hazards.engine.build import find_compiler

    servers = [f.name for f in fams if f.binary]
    if not servers:
        return []
    try:
        find_compiler(toolchain.SM90A)
    except ToolchainMissing as e:
        return [(f"launch servers of {', '.join(servers)}", f"cannot be built ({e}): {consequence}")]
    return []


def _fmt(seconds: float) -> str:
    from hazards.cli.progress import format_duration

    return format_duration(seconds)


@dataclasses.dataclass
class SoakSelection:
    """What a soak would run, validated and not built: the families with a launch server,
    those without one, and the targets file's items (`WorkItem`s, nothing started)."""

    families: list[Family]
    no_server: list[Family]
    targets: list[Any]

    @classmethod
    def of(cls, families: list[str], targets: Path | None, no_families: bool) -> "SoakSelection":
        """UserError for an unknown family or a bad targets file, before any GPU is asked for."""
        from hazards.checkrun import select_families
        from hazards.engine.soak import load_targets

        fams = [] if no_families else select_families(families)
        return cls([f for f in fams if f.binary], [f for f in fams if not f.binary],
                   load_targets(targets) if targets is not None else [])


def soak_plan(selection: SoakSelection | None, *, budget_s: float, allocation: str, explore: float,
              executor: str, resume: int | None, store_path: Path | None) -> Plan:
    """The plan of `hazards soak` (`selection` None: `--resume`, whose items are stored)."""
    skipped = [(f"family {f.name}", "no launch server (static checks only)") for f in (selection.no_server
                                                                                       if selection else [])]
    notes: list[str] = []
    if resume is not None:
        from hazards.engine.store import Store

        with Store(store_path, read_only=True) as store:
            resumed = resumed_soak(store, resume)
            notes.append(f"resumes campaign {resume} of {store.path} ({resumed.status}, "
                         f"{store.run_count(resume)} runs stored)")
        items = [PlannedItem(i.key, i.kind, _expect_label(i.expect), i.timeout_s) for i in resumed.items]
        budget_s, allocation, explore = resumed.left_s, resumed.allocation, resumed.explore_share
        families = []
    else:
        items = [i for f in selection.families for i in _family_items(f, f.variants)]
        items += [PlannedItem(t.key, t.kind, _expect_label(t.expect), t.timeout_s) for t in selection.targets]
        families = selection.families
        skipped += _launch_servers_unbuildable(families, "a real soak stops with this error (exit 2)")
    if not items:
        raise UserError("nothing to soak: no family with a launch server selected and no --targets")
    explore_s = budget_s * explore if families else 0.0
    if explore and families and executor != "local":
        skipped.append(("--explore", f"not run with --executor {executor} (it explores on this host's GPUs)"))
        explore_s = 0.0
    budget = [f"{_fmt(budget_s)} in all" + (" (what the resumed campaign has left)" if resume is not None else "")]
    if explore_s:
        budget.append(f"{_fmt(explore_s)} ({explore:.0%}) to `hazards explore` on "
                      f"{', '.join(f.name for f in families)}, after the items")
    rest = budget_s - explore_s
    if allocation == "uniform":
        budget.append(f"{_fmt(rest)} to the items, equal GPU time each (about {_fmt(rest / len(items))} "
                      "per item on one GPU; each further GPU adds as much)")
    else:
        budget.append(f"{_fmt(rest)} to the items by evidence: canaries until seen failing (then 1 run in 50 "
                      "re-checks them), every other run to the item whose per-launch bound is weakest")
    return Plan("soak", items, budget, skipped, _visible_gpus(), "a real soak stops before it builds anything "
                "(it needs a free GPU)", notes)


@dataclasses.dataclass
class ResumedSoak:
    """What `--resume ID` would continue: the stored work items and the budget left."""

    items: list[Any]
    left_s: float
    allocation: str
    explore_share: float
    status: str


def resumed_soak(store: Any, resume: int) -> ResumedSoak:
    """The stored soak `resume` of an open store, read only; UserError (one line) when it is
    not there, not a soak, or has no work items."""
    from hazards.engine.soak import stored_soak

    camp, items, left = stored_soak(store, resume)
    share = float(camp.spec.get("explore_share", 0.0)) if "explored" not in camp.spec else 0.0
    return ResumedSoak(items, left, camp.spec.get("allocation", "uniform"), share, camp.status)


# The tools the static part asks for: hipcc builds AMD launch servers, never a static check,
# and cuobjdump only stands in for a missing nvdisasm (hazards/static/compile.py).
STATIC_TOOLS = ("nvcc", "clang", "nvdisasm")


def _found(tool: str) -> bool:
    from hazards.engine.toolchain import find_tool

    try:
        find_tool(tool)
    except ToolchainMissing:
        return False
    return True


def check_plan(*, budget_s: float, families: list[str], paths: Iterable[str], parts: set[str],
               skip_tools: set[str], store_path: Path | None) -> Plan:
    """The plan of `hazards check`: the static part (families with static checks, the
    paths, the tools it would use) and the GPU part (every canary and clean variant)."""
    from hazards.checkrun import REPLAY_SHARE, _known_points, gpu_variants, select_families
    from hazards.engine.store import StoreLayout
    from hazards.engine.toolchain import AMD_ARCHS, TOOLS, find_tool
    from hazards.static_catalog import static_family_names

    if {"gpu", "static"} <= parts:
        raise UserError("--skip gpu and --skip static together leave nothing to check")
    fams = select_families(families)
    items: list[PlannedItem] = []
    skipped: list[tuple[str, str]] = []
    budget = [f"{_fmt(budget_s)} in all: the static part beside the GPU part, which gets what the family "
              "builds leave"]
    if "static" in parts:
        skipped.append(("static checks", "--skip static"))
    else:
        static = [f.name for f in fams if f.name in static_family_names()]
        paths = [str(p) for p in paths]
        for p in paths:
            if not Path(p).exists():
                raise UserError(f"no such file or directory: {p}")  # as the static runner says
        items += [PlannedItem(f"static {name}", "static checks (CPU)", "its canaries must be found")
                  for name in static]
        items += [PlannedItem(f"static {p}", "static checks (CPU)", "no failing finding") for p in paths]
        for tool in TOOLS:
            if tool in skip_tools:
                skipped.append((f"tool {tool}", "--skip: the checks that need it are reported as skipped"))
                continue
            if tool not in STATIC_TOOLS:
                continue
            for arch in AMD_ARCHS if TOOLS[tool].targets is not None else (None,):  # clang: per AMD target
                try:
                    find_tool(tool, arch=arch)
                except ToolchainMissing as e:
                    if tool == "nvdisasm" and _found("cuobjdump"):
                        continue  # the SASS checks disassemble with cuobjdump then
                    what = f"tool {tool}" + (f" for {arch}" if arch else "")
                    skipped.append((what, f"not found: a check that needs it cannot run and is named as not "
                                    f"judged (exit 3) unless --skip {tool} ({e})"))
    wanted = [(f, v) for f in fams for v in gpu_variants(f)]
    gpus = _visible_gpus()
    names = ", ".join(f"{f.name}/{v.name}" for f, v in wanted)
    if "gpu" in parts and wanted:
        skipped.append((f"GPU checks of {len(wanted)} variants", f"--skip gpu: {names}"))
    elif wanted:
        for f in fams:
            items += _family_items(f, gpu_variants(f))
        if not gpus:
            skipped.append((f"GPU checks of {len(wanted)} variants", "no usable GPU now: not judged (exit 3) "
                            "unless --skip gpu"))
        if "nvcc" not in skip_tools:
            skipped += _launch_servers_unbuildable([f for f in fams if gpu_variants(f)],
                                                   "their variants are not judged (exit 3) unless --skip gpu")
        replay = _known_points([f for f in fams if gpu_variants(f)], StoreLayout.of(store_path).examples)
        if replay:
            budget.append(f"GPU part: {1 - REPLAY_SHARE:.0%} to the variants (canaries until detected or their "
                          f"blind rate accepted, then the weakest clean bound), {REPLAY_SHARE:.0%} to replaying "
                          f"explore's failing points of {', '.join(f.name for f in replay)}")
        else:
            budget.append("GPU part: canaries until detected or their blind rate accepted, then every run to the "
                          "clean variant whose per-launch bound is weakest")
    skipped += [(f"family {f.name}", "no launch server: static checks only") for f in fams
                if not f.binary and "gpu" not in parts]
    return Plan("check", items, budget, skipped, gpus, "the GPU part is not judged (exit 3) unless --skip gpu"
                if "gpu" not in parts else "not needed (--skip gpu)")
