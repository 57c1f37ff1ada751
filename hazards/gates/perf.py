"""The faithful per-task perf gate: is a candidate faster, task by task, without trading correctness?

The gate is a campaign like any other (kind 'gate-perf'): the leased-campaign frame holds
one GPU exclusively, keeps the catalog's warm server, and stores every run; `PairSchedule`
is its work source. Both sides run on that GPU, interleaved in pairs with the same input
seed (slow drift of clocks or temperature cancels within a pair), the order alternating
(A B, B A, A B, ...: whatever running second costs or gains falls on both sides alike),
`repeats` pairs per worker count. Every run must print FAITHFUL_RESULT lines (or, for a
catalog megakernel, reply with them from a warm server). For each (worker count, task id,
metric) the candidate/baseline ratio is the Hodges-Lehmann estimate of the paired log
ratios with its exact Wilcoxon signed-rank interval (rank-based, distribution-free). The
intervals are Bonferroni-adjusted over every (worker count, task, metric) judged: a verdict
is any interval that excludes 1, so all of them together hold at `conf` and an A/A gate
says anything but no-change with probability at most 1 - `conf` (tests/gates/
test_perf_multiplicity.py measures it; adjusting over the cells alone let three metrics
each call a no-op slower). A megakernel_layers side also times its plain build (no profiler,
tripwire compiled out: what users run) in every sample: the row `launch`, one measurement
(`single_metric`: its slowCTA, wall and sumCTA are the same event time), counted as one
interval. More in docs/gates.md.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import os
import re
import shlex
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from hazards.engine.classify import DEFAULT_FAITHFUL_COS_MIN
from hazards.engine.errors import EXIT_HAZARD, EXIT_OK, UserError
from hazards.engine.loop import TargetFactory, WorkItem, default_target_factory
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.stats import Interval, min_pairs, shift_ci

METRICS = ("slowCTA", "wall", "sumCTA")


class PerfVerdict(enum.StrEnum):
    """What the gate concluded about a candidate at a worker count (or overall: the worst)."""

    NO_CHANGE = "no-change"  # nothing significant
    FASTER = "faster"        # slowCTA or wall significantly down, nothing significantly up
    SLOWER = "slower"        # any of slowCTA, wall, sumCTA significantly up
    SLOUGHING = "sloughing"  # slowCTA down and sumCTA up: the same work spread over more blocks
    INCORRECT = "incorrect"  # a candidate run failed its correctness check, crashed or hung

    @property
    def rank(self) -> int:
        """Severity: incorrect > sloughing > slower > faster > no-change."""
        return list(PerfVerdict).index(self)

    @property
    def passing(self) -> bool:
        """Whether this verdict lets the gate pass (exit 0)."""
        return self in (PerfVerdict.FASTER, PerfVerdict.NO_CHANGE)


VERDICTS = tuple(v.value for v in PerfVerdict)
# Catalog sides: `PREFIX:NAME` names a candidate of a megakernel whose faithful check serves
# every catalog side of that prefix from one warm server (module run with --serve).
CATALOGS = {"megakernel:": "hazards.ragged_decode.faithful", "megakernel_layers:": "hazards.megakernel_layers.faithful"}
CATALOG_PREFIX = "megakernel:"  # the ragged-decode megakernel's (docs and tests name it)
# `PREFIX:NAME@REV`: the candidate built from the kernel sources at git revision REV (the
# family folder whose history is read). The ragged-decode library is loaded into the
# server's own process through ctypes: an old library's ABI could crash it, so no @REV there.
REVISION_FOLDERS = {"megakernel_layers:": "megakernel_layers"}
DEFAULT_WORKERS = (8, 64, 68, 128, 132)
DEFAULT_REPEATS = 12
DEFAULT_MIN_EFFECT = 0.02
DEFAULT_MIN_US = 1.0
DEFAULT_CONF = 0.95
# Plain-build launches a megakernel_layers sample times for its `launch` row (0: no row).
DEFAULT_PLAIN_LAUNCHES = 20
PLAIN_PREFIX = "megakernel_layers:"  # the catalog whose faithful server times its plain build
_FLOOR_US = 1e-3  # a zero-length span (below the timer step) counts as 1 ns in a ratio


class GateError(UserError):
    """The gate cannot judge (a baseline that fails, a run without result lines, ...)."""


def worst(verdicts: Sequence[str]) -> PerfVerdict:
    """The most severe verdict: incorrect > sloughing > slower > faster > no-change."""
    return max((PerfVerdict(v) for v in verdicts), key=lambda v: v.rank, default=PerfVerdict.NO_CHANGE)


@dataclasses.dataclass
class Sample:
    """One run of one side at one worker count (`outcome` as the engine judged the run)."""

    ok: bool
    reason: str
    rows: dict[int, dict[str, Any]]
    outcome: str = "clean"
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # row name -> why the run left it out

    @property
    def cos(self) -> float | None:
        vals = [float(r["cos"]) for r in self.rows.values() if "cos" in r]
        return min(vals) if vals else None

    @classmethod
    def from_result(cls, result: RunResult, label: str) -> "Sample":
        """A run as the engine judged it; its FAITHFUL_RESULT rows (a command's evidence, a
        catalog server's reply metrics)."""
        lines = (result.evidence or {}).get("faithful") or (result.metrics or {}).get("faithful") or []
        outcome = Outcome(result.outcome)
        skipped = (result.metrics or {}).get("skipped_rows") or {}
        return cls(outcome is Outcome.CLEAN, result.reason, rows_by_task(lines, label), outcome.value,
                   {str(k): str(v) for k, v in skipped.items()} if isinstance(skipped, dict) else {})


def row_tests(rows: Sequence[dict[str, Any]]) -> int:
    """Intervals one judged (worker count, task) cell adds to the Bonferroni family: one for a
    row whose three metrics are one measurement (`single_metric`, the plain build's `launch`),
    three otherwise."""
    return 1 if rows and all(r.get("single_metric") is True for r in rows) else len(METRICS)


def rows_by_task(payloads: Sequence[dict[str, Any]], label: str) -> dict[int, dict[str, Any]]:
    """FAITHFUL_RESULT payloads keyed by task id; two different lines for one id are an error."""
    out: dict[int, dict[str, Any]] = {}
    for p in payloads:
        tid = int(p["task_id"])
        if tid in out and out[tid] != p:
            raise GateError(f"{label}: two different FAITHFUL_RESULT lines for task {tid} in one run")
        out[tid] = p
    return out


def side_item(spec: str, *, cwd: str, timeout: float, cos_min: float, launches: int,
              revision: Any = None, plain_launches: int = 0) -> WorkItem:
    """The work item of one side (`spec`: a command, or PREFIX:NAME[@REV] of a catalog megakernel),
    before a sample's worker count and seed are put in (`sample_item`). Every catalog side
    of one megakernel has the same server argv: the frame keeps one warm server for them.
    `revision`: the side's sources when the caller resolved them already (`resolve_side_sources`;
    extracting a revision runs git). `plain_launches`: a megakernel_layers side's plain-build
    launches per sample (its `launch` row; 0: none). A name that matches nothing or a program
    that does not exist: UserError, here."""
    prefix = catalog_of(spec)
    if prefix is not None:
        cand = catalog_candidate(spec)
        rev = revision if revision is not None else catalog_revision(spec)  # no '@': None, no git run
        module = CATALOGS[prefix]
        at = {"revision": rev.commit, "sources": str(rev.standalone)} if rev else {}
        if prefix == PLAIN_PREFIX and plain_launches > 0:
            at["plain_launches"] = plain_launches
        return WorkItem(target=module.rsplit(".", 2)[-2] + "-faithful",
                        variant=cand.name + (f"@{rev.commit}" if rev else ""), kind="server",
                        argv=(sys.executable, "-m", module, "--serve"),
                        params={"candidate": cand.name, "cos_min": cos_min, **at}, launches=launches,
                        timeout_s=timeout, handshake_timeout_s=max(timeout, 300.0), respawn_every=0)
    from hazards.engine.targets import CommandTarget

    try:
        argv = shlex.split(spec)
    except ValueError as exc:
        raise UserError(f"cannot split command {spec!r}: {exc}") from None
    if not argv:
        raise UserError("empty command")
    CommandTarget(_with_workers(argv, 1), env=dict(os.environ), cwd=cwd)  # the program exists
    return WorkItem(target=spec, kind="command", argv=tuple(argv), cwd=cwd, timeout_s=timeout)


def _with_workers(argv: Sequence[str], workers: int) -> list[str]:
    return [a.replace("{workers}", str(workers)) for a in argv]


def sample_item(side: WorkItem, workers: int, seed: int) -> WorkItem:
    """One sample of a side: a command gets the worker count as `{workers}` in its argv and
    $HZ_NUM_WORKERS, the pair's seed as $HZ_GATE_SEED; a catalog server gets both in its request."""
    if side.kind == "server":
        return dataclasses.replace(side, params={**side.params, "workers": workers, "seed": seed})
    return dataclasses.replace(side, argv=tuple(_with_workers(side.argv, workers)),
                               env={**side.env, "HZ_NUM_WORKERS": str(workers), "HZ_GATE_SEED": str(seed)})


def gate_targets(cos_min: float) -> TargetFactory:
    """The frame's target factory: command sides judge FAITHFUL_RESULT cos against `cos_min`
    (a catalog server gets it in each request)."""
    def make(item: WorkItem, env: dict[str, str]) -> Any:
        if item.kind == "command":
            from hazards.engine.targets import CommandTarget

            return CommandTarget(list(item.argv), env=env, cwd=item.cwd, name=item.target, faithful_cos_min=cos_min)
        return default_target_factory(item, env)
    return make


def split_revision(spec: str) -> tuple[str, str | None]:
    """A catalog side's `PREFIX:NAME` and its revision: 'megakernel_layers:step_a@HEAD~2' ->
    ('megakernel_layers:step_a', 'HEAD~2'); no '@': (spec, None). UserError for an empty REV."""
    side, at, rev = spec.partition("@")
    if at and not rev:
        raise UserError(f"{spec!r}: nothing after '@' (write {side}@REV, REV a git revision)")
    return side, rev if at else None


def catalog_revision(spec: str) -> Any:
    """The kernel sources a `PREFIX:NAME@REV` side is built from (`kernel_sources.
    RevisionSources`: the full commit id and the extracted tree), None without '@'.
    UserError, one line, for a catalog without revisions, a revision git does not know, a
    tree outside a git checkout, a revision without the family's folder or table, or one whose
    kernel never names a define NAME sets (and today's reads) or defines it itself, unguarded."""
    prefix = catalog_of(spec)
    _, rev = split_revision(spec)
    if rev is None:
        return None
    if prefix not in REVISION_FOLDERS:
        known = ", ".join(f"{p}NAME@REV" for p in REVISION_FOLDERS)
        raise UserError(f"{spec!r}: a side at a git revision is built only for {known} "
                        f"({prefix}NAME runs its library inside the server's own process)")
    from hazards.family import TABLE_FILE, read_table
    from hazards.kernel_sources import family_dir, revision_sources

    folder = REVISION_FOLDERS[prefix]
    at = revision_sources(rev, folder)
    table = at.standalone / folder / TABLE_FILE
    if not table.is_file():  # the family's binary is built from its table (hz_family_table.h)
        raise UserError(f"revision {rev!r} ({at.commit[:12]}) has no {folder}/{TABLE_FILE}: it predates the "
                        "family table the build needs")
    read_table(table)  # today's reader: a table it cannot read is one line here, before the lease
    cand = catalog_candidate(spec)
    # a define today's kernel reads and the revision's never does would build that revision's
    # default kernel under NAME's label (one no kernel reads, noop's, is read by neither)
    unread = [d for d, _ in cand.defines if _reads_define(family_dir(folder), d)
              and not _reads_define(at.standalone / folder, d)]
    if unread:
        raise UserError(f"{spec!r}: the kernel at {rev!r} ({at.commit[:12]}) never reads {', '.join(unread)}, "
                        f"which {cand.name} sets: it would build that revision's default kernel under "
                        f"{cand.name}'s name")
    # one the revision's kernel defines itself (no #ifndef guard) overrides the build's -D: nvcc
    # warns and builds the revision's value (step_g_on_e's MKL_ATTN_AHEAD before it was overridable)
    fixed = [d for d, _ in cand.defines if _defines_unguarded(at.standalone / folder, d)]
    if fixed:
        raise UserError(f"{spec!r}: the kernel at {rev!r} ({at.commit[:12]}) defines {', '.join(fixed)} itself "
                        f"(no #ifndef guard), which {cand.name} sets: the build would keep that revision's "
                        f"value under {cand.name}'s name")
    return at


def _source_texts(folder: Path) -> list[str]:
    """The text of every source file under `folder`."""
    from hazards.engine.toolchain import SOURCE_SUFFIXES

    return [p.read_text(errors="replace") for p in sorted(folder.rglob("*"))
            if p.is_file() and p.suffix in SOURCE_SUFFIXES]


def _reads_define(folder: Path, name: str) -> bool:
    """Whether a source file under `folder` names the macro `name`."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    return any(word.search(text) for text in _source_texts(folder))


_GUARD = r"#\s*(?:ifndef\s+{0}\b|if\s+!\s*defined\s*\(?\s*{0}\b)"


def _defines_unguarded(folder: Path, name: str) -> bool:
    """Whether a source file under `folder` `#define`s the macro `name` outside an `#ifndef name`
    (or `#if !defined(name)`) block: a `-Dname=V` is then redefined by the source, not an error."""
    guard = re.compile(_GUARD.format(re.escape(name)))
    define = re.compile(rf"#\s*define\s+{re.escape(name)}\b")
    for source in _source_texts(folder):
        open_ifs: list[bool] = []  # per open #if: is it a guard of `name` (its first branch only)
        for line in source.splitlines():
            text = line.strip()
            if re.match(r"#\s*if", text):
                open_ifs.append(bool(guard.match(text)))
            elif re.match(r"#\s*(?:else|elif)\b", text) and open_ifs:
                open_ifs[-1] = False
            elif re.match(r"#\s*endif\b", text) and open_ifs:
                open_ifs.pop()
            elif define.match(text) and not any(open_ifs):
                return True
    return False


def resolve_side(spec: str) -> str:
    """`spec` as the gate records it: a catalog side's revision as its full commit id (a
    moving branch name is not a record); a command or a side without '@' unchanged.
    UserError for a name that matches nothing or a bad revision."""
    return resolve_side_sources(spec)[0]


def resolve_side_sources(spec: str) -> tuple[str, Any]:
    """`resolve_side`'s record and the sources it resolved (`catalog_revision`'s; None for a
    command or a side without '@'), so the side's work item need not extract them again."""
    if catalog_of(spec) is None:
        return spec, None
    catalog_candidate(spec)  # an unknown NAME is reported before the revision
    rev = catalog_revision(spec)
    return (spec if rev is None else f"{split_revision(spec)[0]}@{rev.commit}"), rev


def catalog_candidate(spec: str) -> Any:
    """The catalog candidate a megakernel:NAME / megakernel_layers:NAME (each optionally
    @REV) names (UserError with the known names for one that matches nothing)."""
    prefix = catalog_of(spec)
    name = split_revision(spec)[0][len(prefix):]
    if prefix == CATALOG_PREFIX:
        from hazards.ragged_decode import candidates

        return candidates.get(name)
    from hazards.megakernel_layers import faithful

    return faithful.candidate(name)


def catalog_of(spec: str) -> str | None:
    """The catalog prefix `spec` starts with (None: a command)."""
    return next((prefix for prefix in CATALOGS if spec.startswith(prefix)), None)


def is_catalog(spec: str) -> bool:
    return catalog_of(spec) is not None


def ratio_interval(base: Sequence[float], cand: Sequence[float], conf: float) -> Interval:
    """candidate/baseline ratio from paired values: exp of the signed-rank interval of logs."""
    diffs = [math.log(max(c, _FLOOR_US) / max(b, _FLOOR_US)) for b, c in zip(base, cand)]
    iv = shift_ci(diffs, conf)
    return Interval(math.exp(iv.estimate), math.exp(iv.lo) if iv.resolved else -math.inf,
                    math.exp(iv.hi) if iv.resolved else math.inf, iv.achieved, iv.n)


def judge(ratios: dict[str, Interval], min_effect: float) -> PerfVerdict:
    """The verdict of one task from its three ratio intervals (docs/gates.md, In the code)."""
    def down(m: str) -> bool:
        r = ratios[m]
        return r.resolved and r.hi < 1.0 and r.estimate < 1.0 - min_effect

    def up(m: str) -> bool:
        r = ratios[m]
        return r.resolved and r.lo > 1.0 and r.estimate > 1.0 + min_effect

    if down("slowCTA") and up("sumCTA"):
        return PerfVerdict.SLOUGHING
    if any(up(m) for m in METRICS):
        return PerfVerdict.SLOWER
    if down("slowCTA") or down("wall"):
        return PerfVerdict.FASTER
    return PerfVerdict.NO_CHANGE


@dataclasses.dataclass
class Pair:
    workers: int
    seed: int
    baseline: Sample
    candidate: Sample


def _select_tasks(pairs: Sequence[Pair], wanted: Sequence[str] | None, label: str) -> list[int]:
    """Task ids present in every run of both sides, optionally restricted by id or name.
    GateError when the sides give one id two names: rows are paired by id, and a side built
    elsewhere (a git revision, another program) may number its tasks otherwise."""
    common: set[int] | None = None
    side_names: tuple[dict[int, str], dict[int, str]] = ({}, {})
    for p in pairs:
        for s, named in zip((p.baseline, p.candidate), side_names):
            ids = set(s.rows)
            common = ids if common is None else common & ids
            named.update({t: str(r.get("task", "")) for t, r in s.rows.items()})
    common = common or set()
    for t in sorted(common):
        base, cand = side_names[0].get(t, ""), side_names[1].get(t, "")
        if base and cand and base != cand:
            raise GateError(f"{label}: task {t} is {base!r} in the baseline's runs and {cand!r} in {label}'s: "
                            "the sides number their tasks differently; rows paired by id would compare two tasks")
    names = {**side_names[0], **side_names[1]}
    if not wanted:
        if not common:
            raise GateError(f"{label}: no task id appears in every run of both sides")
        return sorted(common)
    out = []
    for w in wanted:
        hit = [t for t in common if str(t) == w or names.get(t) == w]
        if not hit:
            have = ", ".join(f"{t} {names.get(t, '')}" for t in sorted(common)) or "none"
            raise GateError(f"{label}: task {w!r} is not in every run of both sides (common: {have})")
        out.extend(hit)
    return sorted(set(out))


def evaluate(baseline_label: str, candidate_label: str, pairs: Sequence[Pair], *, conf: float = DEFAULT_CONF,
             min_effect: float = DEFAULT_MIN_EFFECT, min_us: float = DEFAULT_MIN_US,
             tasks: Sequence[str] | None = None) -> dict[str, Any]:
    """Judge one candidate from its pairs (all worker counts): the gate's JSON object."""
    by_w: dict[int, list[Pair]] = {}
    for p in pairs:
        by_w.setdefault(p.workers, []).append(p)
    bad_base = [p for p in pairs if not p.baseline.ok]
    if bad_base:
        p = bad_base[0]
        raise GateError(f"the baseline failed its own check at {p.workers} workers (seed {p.seed}): "
                        f"{p.baseline.reason}; nothing can be judged against it")
    clean = [p for p in pairs if p.candidate.ok]
    task_ids = _select_tasks(clean, None, candidate_label) if clean else []  # ratios for every common task
    selected = set(_select_tasks(clean, tasks, candidate_label)) if clean else set()  # verdicts from these
    names = {t: str(p.baseline.rows[t].get("task", t)) for p in pairs for t in p.baseline.rows}
    judged_tests = 0  # every interval a verdict may read: 3 per judged cell, 1 for a single-metric row
    for w, ps in by_w.items():
        if all(p.candidate.ok for p in ps):
            for t in selected:
                base_slow = sorted(p.baseline.rows[t]["slowCTA_us"] for p in ps)
                if base_slow[len(base_slow) // 2] >= min_us:
                    judged_tests += row_tests([r for p in ps for r in (p.baseline.rows[t], p.candidate.rows[t])])
    skipped_rows = {name: f"{side}: {why}" for p in pairs
                    for side, s in ((baseline_label, p.baseline), (candidate_label, p.candidate))
                    for name, why in s.skipped.items()}
    interval_conf = 1.0 - (1.0 - conf) / max(1, judged_tests)
    points = []
    for w in sorted(by_w):
        ps = by_w[w]
        cos_b = [p.baseline.cos for p in ps if p.baseline.cos is not None]
        cos_c = [p.candidate.cos for p in ps if p.candidate.cos is not None]
        point: dict[str, Any] = {"workers": w, "pairs": len(ps),
                                 "cos": {"baseline": min(cos_b) if cos_b else None,
                                         "candidate": min(cos_c) if cos_c else None}}
        failed = [p for p in ps if not p.candidate.ok]
        if failed:
            point.update(verdict=PerfVerdict.INCORRECT, reason=f"{len(failed)} of {len(ps)} candidate runs failed: "
                                                     f"{failed[0].candidate.reason}", ratios={}, tasks={})
            points.append(point)
            continue
        ratios: dict[str, Any] = {}
        task_verdicts: dict[str, PerfVerdict] = {}
        unresolved = []
        for t in task_ids:
            name = names.get(t, str(t))
            per = {m: ratio_interval([p.baseline.rows[t][f"{m}_us"] for p in ps],
                                     [p.candidate.rows[t][f"{m}_us"] for p in ps], interval_conf)
                   for m in METRICS}
            base_slow = sorted(p.baseline.rows[t]["slowCTA_us"] for p in ps)[len(ps) // 2]
            entry = {m: {"ratio": iv.estimate, "lo": iv.lo if iv.resolved else None,
                         "hi": iv.hi if iv.resolved else None} for m, iv in per.items()}
            entry["task_id"] = t
            entry["baseline_slowCTA_us"] = base_slow
            if row_tests([r for p in ps for r in (p.baseline.rows[t], p.candidate.rows[t])]) == 1:
                entry["single_metric"] = True  # slowCTA = wall = sumCTA: one time (the plain build's launch)
            if t not in selected:
                entry["judged"] = False
                entry["why_not"] = "not selected (--task)"
            elif base_slow < min_us:
                entry["judged"] = False
                entry["why_not"] = f"baseline slowCTA {base_slow:.3g} us < {min_us:g} us (timer resolution)"
            else:
                entry["judged"] = True
                if not all(iv.resolved for iv in per.values()):  # too few pairs: could not look
                    raise GateError(f"{candidate_label}: {len(ps)} pairs give no interval at the adjusted level "
                                    f"{interval_conf:.4g}; use --repeats {min_pairs(interval_conf)} or more")
                task_verdicts[name] = judge(per, min_effect)
                s = per["slowCTA"]
                if not s.resolved or math.log(s.hi) - math.log(s.lo) > 2 * math.log(1.025):
                    unresolved.append(name)
            ratios[name] = entry
        if not task_verdicts:  # nothing was judged here: never a silent "no-change"
            raise GateError(f"{candidate_label}: no task could be judged at {w} workers (every selected task is "
                            f"below --min-us {min_us:g} or absent); nothing to decide from")
        point.update(verdict=worst(list(task_verdicts.values())), tasks=task_verdicts, ratios=ratios)
        if unresolved:
            point["unresolved"] = unresolved  # slowCTA interval wider than +-2.5%: a 5% change may hide
        points.append(point)
    out = {"verdict": worst([p["verdict"] for p in points]), "baseline": baseline_label,
           "candidate": candidate_label, "conf": conf, "interval_conf": interval_conf,
           "judged_tests": judged_tests, "min_effect": min_effect, "min_us": min_us, "points": points}
    if skipped_rows:
        out["skipped_rows"] = skipped_rows  # rows a side's runs left out, and why (neither judged nor shown)
    return out


def check_skipped(first: Sample, tasks: Sequence[str] | None, label: str) -> None:
    """Stop at a side's first run when a --task names a row that run left out, saying why (the
    plain build of a revision from before plain launches: no `launch` row): GateError. A
    --task names the row by name or by id, as check_tasks takes it."""
    from hazards.megakernel_layers.faithful import LAUNCH_TASK, LAUNCH_TASK_ID

    ids = {LAUNCH_TASK: LAUNCH_TASK_ID}  # a skipped row's id: the runs name skipped rows by name only
    for wanted in tasks or ():
        for name, why in first.skipped.items():
            if wanted in (name, str(ids.get(name))):
                raise GateError(f"--task {wanted!r}: {label}'s first run did not measure it: {why}")


def check_tasks(first: Sample, tasks: Sequence[str] | None) -> None:
    """Stop before the long run when a --task names no task (id or name) of the first
    baseline run: the task names come from the runs, so this is the earliest check (GateError)."""
    for wanted in tasks or ():
        if not any(str(t) == wanted or str(r.get("task")) == wanted for t, r in first.rows.items()):
            have = ", ".join(f"{t} {r.get('task', '')}".strip() for t, r in sorted(first.rows.items()))
            raise GateError(f"--task {wanted!r} names no task of the baseline's first run (its tasks: {have})")


def check_repeats(first: Sample, tasks: Sequence[str] | None, points: int, repeats: int, conf: float,
                  min_us: float) -> None:
    """Stop before the long run when `repeats` pairs cannot give an exact interval at the
    Bonferroni-adjusted level for the tasks the first baseline run shows (GateError)."""
    judged = [r for t, r in first.rows.items()
              if (not tasks or str(t) in tasks or str(r.get("task")) in tasks) and r["slowCTA_us"] >= min_us]
    per_point = sum(row_tests([r]) for r in judged)
    level = 1.0 - (1.0 - conf) / max(1, points * per_point)
    need = min_pairs(level)
    if repeats < need:
        singles = sum(row_tests([r]) == 1 for r in judged)
        what = (f"{len(judged)} tasks x {len(METRICS)} metrics" if not singles else
                f"({len(judged) - singles} tasks x {len(METRICS)} metrics + {singles} single-metric row"
                + ("s)" if singles > 1 else ")"))
        raise GateError(f"--repeats {repeats} cannot give an interval at {level:.4g} ({conf:g} family-wise over "
                        f"{points} worker counts x {what}): use --repeats {need} or more")


@dataclasses.dataclass(frozen=True)
class Step:
    """One run of the schedule: which side, for which candidate's pair, where."""

    role: str  # "baseline" | "candidate"
    candidate: str
    workers: int
    seed: int


def baseline_first(pair: int) -> bool:
    """Whether the baseline runs first in pair `pair` of a worker count: even pairs A B, odd
    pairs B A. With one fixed order, anything the second run of a pair gains or loses (a
    warmer cache, a clock step after the first) reads as the candidate's effect."""
    return pair % 2 == 0


def schedule(candidates: Sequence[str], workers: Sequence[int], repeats: int) -> list[Step]:
    """The interleaved schedule: per worker count, per repeat i, per candidate, a pair with
    seed i in the order `baseline_first(i)` says."""
    return [Step(role, c, w, i) for w in workers for i in range(repeats) for c in candidates
            for role in (("baseline", "candidate") if baseline_first(i) else ("candidate", "baseline"))]


class PairSchedule:
    """The gate's work source on the leased-campaign frame: the schedule's runs one by one,
    each run's FAITHFUL_RESULT rows paired up per (candidate, worker count, seed).

    It stops the campaign (`stop_reason`; `error` is the GateError to raise) at the first
    run that cannot be judged (an `error` run, a clean run without result lines), a
    baseline that fails its own check, or when `check(first clean baseline sample)`
    refuses (too few repeats). `progress(line)` hears each completed pair."""

    def __init__(self, baseline: WorkItem, candidates: dict[str, WorkItem], workers: Sequence[int], repeats: int,
                 *, baseline_label: str, check: Callable[[Sample], None] | None = None,
                 progress: Callable[[str], None] | None = None, tasks: Sequence[str] | None = None) -> None:
        self.baseline, self.candidates, self.repeats = baseline, dict(candidates), repeats
        self.baseline_label, self.check, self.progress = baseline_label, check, progress
        self.tasks = list(tasks) if tasks else None  # a side's first run that left one of these out stops it
        self._seen: set[str] = set()  # sides (baseline, candidate labels) whose first run was looked at
        self.steps = schedule(list(candidates), workers, repeats)
        self.pairs: dict[str, list[Pair]] = {c: [] for c in candidates}
        self.error: GateError | None = None
        self._mu = threading.Lock()
        self._next = 0
        self._issued: dict[int, Step] = {}
        self._halves: dict[tuple[str, int, int], dict[str, Sample]] = {}

    @property
    def items(self) -> list[WorkItem]:
        return [self.baseline, *self.candidates.values()]

    @property
    def total(self) -> int:
        return len(self.steps)

    @property
    def stop_reason(self) -> str | None:
        return str(self.error) if self.error is not None else None

    def next_item(self, gpu: str) -> WorkItem | None:
        with self._mu:
            if self.error is not None or self._next >= len(self.steps):
                return None
            step = self.steps[self._next]
            self._next += 1
            side = self.baseline if step.role == "baseline" else self.candidates[step.candidate]
            item = sample_item(side, step.workers, step.seed)
            self._issued[id(item)] = step
            return item

    def report(self, item: WorkItem, result: RunResult) -> None:
        with self._mu:
            step = self._issued.pop(id(item))
            if self.error is None:
                try:
                    self._take(step, result)
                except GateError as exc:
                    self.error = exc

    def _take(self, step: Step, result: RunResult) -> None:
        label = self.baseline_label if step.role == "baseline" else step.candidate
        where = f"at {step.workers} workers (seed {step.seed})"
        s = Sample.from_result(result, label)
        if s.outcome == Outcome.ERROR.value:  # the check itself failed: nothing to judge
            raise GateError(f"the {step.role} run {where} could not be judged: {s.reason}")
        if s.ok and not s.rows:
            raise GateError(f"the {step.role} run {where} printed no FAITHFUL_RESULT line")
        if s.ok and label not in self._seen:
            self._seen.add(label)
            check_skipped(s, self.tasks, label)
        if step.role == "baseline":
            if not s.ok:
                raise GateError(f"the baseline failed its own check {where}: {s.reason}")
            if self.check is not None:
                check, self.check = self.check, None
                check(s)
        halves = self._halves.setdefault((step.candidate, step.workers, step.seed), {})
        halves[step.role] = s
        if len(halves) == 2:
            del self._halves[(step.candidate, step.workers, step.seed)]
            a, b = halves["baseline"], halves["candidate"]
            self.pairs[step.candidate].append(Pair(step.workers, step.seed, a, b))
            if self.progress:
                self.progress(f"workers {step.workers} pair {step.seed + 1}/{self.repeats} {step.candidate}: "
                              f"baseline {'ok' if a.ok else 'FAILED'}, candidate {'ok' if b.ok else 'FAILED'}")

    def finished(self) -> bool:
        with self._mu:
            return self.error is not None or (self._next >= len(self.steps) and not self._issued)


def run_gate(baseline: str, candidates: Sequence[str], *, workers: Sequence[int] = DEFAULT_WORKERS,
             repeats: int = DEFAULT_REPEATS, conf: float = DEFAULT_CONF, min_effect: float = DEFAULT_MIN_EFFECT,
             min_us: float = DEFAULT_MIN_US, cos_min: float = DEFAULT_FAITHFUL_COS_MIN,
             tasks: Sequence[str] | None = None, timeout: float = 600.0, launches: int = 5,
             plain_launches: int = DEFAULT_PLAIN_LAUNCHES, wait_s: float = 3600.0, cwd: str | None = None,
             store_path: str | Path | None = None,
             lock_dir: str | None = None, exclusive: bool = True,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Lease a GPU, run the interleaved schedule as a 'gate-perf' campaign on the
    leased-campaign frame (every run stored), judge every candidate. The JSON object: one
    candidate -> {"verdict", "points": [...], ...}; several -> {"verdict", "candidates": [...]};
    both carry the "campaign" id. The verdicts go into the campaign's spec too."""
    from hazards.engine.campaign import LeasedCampaign
    from hazards.engine.store import Store

    if not candidates:
        raise UserError("give at least one --candidate")
    if any(w < 1 for w in workers) or not workers:
        raise UserError("--workers must list positive worker counts")
    if repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {repeats}")
    from hazards.megakernel_layers.faithful import MAX_PLAIN_LAUNCHES

    if not 0 <= plain_launches <= MAX_PLAIN_LAUNCHES:
        raise UserError(f"--plain-launches must be in [0, {MAX_PLAIN_LAUNCHES}], got {plain_launches}")
    if not 0 < conf < 1 or not 0 <= min_effect < 1 or not -1 <= cos_min <= 1 or min_us < 0:
        raise UserError("need 0 < --conf < 1, 0 <= --min-effect < 1, -1 <= --cos-min <= 1, --min-us >= 0")
    cwd = cwd or os.getcwd()
    # bad names, revisions: before the lease; each revision is extracted once
    resolved, revisions = zip(*(resolve_side_sources(spec) for spec in (baseline, *candidates)))
    # each side as the user spelled it (the baseline and a candidate may name one commit)
    base_given, cand_given = baseline, dict(zip(resolved[1:], candidates))
    if len(set(resolved[1:])) != len(candidates):
        raise UserError("the same candidate was given twice" + ("" if len(set(candidates)) < len(candidates)
                                                                  else " (two revisions name one commit)"))
    baseline, candidates = resolved[0], list(resolved[1:])
    # a name that matches nothing or a missing program: before any lease
    base_item, *cand_items = [side_item(spec, cwd=cwd, timeout=timeout, cos_min=cos_min, launches=launches,
                                        revision=rev, plain_launches=plain_launches)
                              for spec, rev in zip((baseline, *candidates), revisions)]
    def check_first_run(first: Sample) -> None:
        check_tasks(first, tasks)
        check_repeats(first, tasks, len(workers), repeats, conf, min_us)

    source = PairSchedule(base_item, dict(zip(candidates, cand_items)), list(workers), repeats,
                          baseline_label=baseline, progress=progress,
                          check=check_first_run, tasks=tasks)
    spec = {"baseline": baseline, "candidates": list(candidates), "workers": list(workers), "repeats": repeats,
            "conf": conf, "min_effect": min_effect, "min_us": min_us, "cos_min": cos_min,
            "tasks": list(tasks) if tasks else None, "profiled_launches": launches,
            "plain_launches": plain_launches}
    with Store(store_path) as store:
        with LeasedCampaign.acquire(store, "hazards gate perf", max_gpus=1, lock_dir=lock_dir, wait_s=wait_s,
                                    exclusive=exclusive, target_factory=gate_targets(cos_min)) as frame:
            campaign_id = frame.create("gate-perf", spec)
            frame.run(campaign_id, source)
        if source.error is not None:
            raise source.error
        results = []
        for c in candidates:
            res = evaluate(baseline, c, source.pairs[c], conf=conf, min_effect=min_effect, min_us=min_us,
                           tasks=tasks)
            res.update(repeats=repeats, campaign=campaign_id, baseline_side=_describe(baseline, base_item, base_given),
                       candidate_side=_describe(c, source.candidates[c], cand_given[c]),
                       min_pairs_for_interval=min_pairs(res["interval_conf"]))
            results.append(res)
        store.update_campaign_spec(campaign_id, {**store.campaign(campaign_id).spec,
                                                 "verdicts": {r["candidate"]: r["verdict"] for r in results}})
    if len(results) == 1:
        return results[0]
    return {"verdict": worst([r["verdict"] for r in results]), "campaign": campaign_id, "candidates": results}


def _describe(spec: str, item: WorkItem, given: str) -> dict[str, Any]:
    """A side as the JSON object names it: its command, or its catalog candidate (and the
    full commit its sources came from, beside the revision as given)."""
    if item.kind == "server":
        out = {"label": spec, "candidate": catalog_candidate(spec).to_json()}
        if "revision" in item.params:
            out.update(revision=item.params["revision"], given=given)
        return out
    return {"label": spec, "command": list(item.argv)}


def exit_code(result: dict[str, Any]) -> int:
    """0 when every candidate is faster or no-change, else 1."""
    verdicts = [r["verdict"] for r in result.get("candidates", [result])]
    return EXIT_OK if all(PerfVerdict(v).passing for v in verdicts) else EXIT_HAZARD


def format_report(result: dict[str, Any]) -> str:
    """The human table: per candidate and worker count, the ratios with intervals and a verdict."""
    lines = []
    for r in result.get("candidates", [result]):
        lines.append(f"{r['candidate']} vs {r['baseline']}: {r['verdict'].upper()}  "
                     f"({r['repeats']} pairs per point, intervals at {r['interval_conf']:.4g} "
                     f"for {r['conf']:g} family-wise over {r['judged_tests']} (workers, task, metric), "
                     f"min effect {r['min_effect']:g})")
        for p in r["points"]:
            cos = p["cos"]
            cos_txt = (f"cos base {cos['baseline']:.5f} cand {cos['candidate']:.5f}"
                       if cos["baseline"] is not None and cos["candidate"] is not None else "cos n/a")
            lines.append(f"  workers {p['workers']:>4}: {p['verdict']:<10} {cos_txt}"
                         + (f"  [{p['reason']}]" if p.get("reason") else ""))
            for name, e in p.get("ratios", {}).items():
                cells = []
                for m in (("slowCTA",) if e.get("single_metric") else METRICS):
                    x = e[m]
                    iv = f"[{x['lo']:.3f}, {x['hi']:.3f}]" if x["lo"] is not None else "[unresolved]"
                    cells.append(f"{'time per launch (plain build)' if e.get('single_metric') else m} "
                                 f"{x['ratio']:.3f} {iv}")
                judged = p["tasks"].get(name, "not judged")
                lines.append(f"      {name:<10} {'  '.join(cells)}  -> {judged}")
            if p.get("unresolved"):
                lines.append(f"      note: slowCTA interval wider than +-2.5% for {', '.join(p['unresolved'])}: "
                             "add --repeats to resolve a 5% change")
        for name, why in r.get("skipped_rows", {}).items():
            lines.append(f"  {name}: {why}")
    if "candidates" in result:
        lines.append(f"overall: {result['verdict'].upper()}")
    return "\n".join(lines)


def parse_workers(text: str) -> list[int]:
    """'8,64,68' -> [8, 64, 68]; UserError for anything else."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--workers must be comma-separated integers, got {text!r}") from None
    if not out or any(w < 1 for w in out):
        raise UserError(f"--workers must list positive integers, got {text!r}")
    return out

