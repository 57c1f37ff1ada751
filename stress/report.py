"""Campaign reports: an HTML page engineers open in the morning, a markdown summary for CI logs.

`build_report(store, campaign_id)` gathers everything from the store: the run context of
each session (command, folder and its `git describe`, host, GPUs, driver), outcome counts
and failure rates with exact 95% intervals per target/variant (every work item of the
spec, run or not, with the verdict its command gave: a soak's against the store's
history), the failing runs of each row with their artifact folders, trends over the dates
of the last N campaigns of the same kind, time-to-failure and kernel-time distributions,
the GPU telemetry table (from each run's `evidence["telemetry"]` plus the campaign's
telemetry summary), failure signatures (a raw example run with its artifacts, first and
last seen in the whole store, new ones marked: never seen before in the store) and
significant rate changes. For triage, each failure signature also carries its example
run's diagnostic line (the matched fault signature, the uncaught exception, the failing
result line...) and the last lines of its stderr, the `hazards repro` command that
reproduces it (rebuilt from the stored work item: the engine never imports the catalog, so
the caller names the catalog's families), its hang.md, and how many more runs it had; a
"new since the previous campaign" section opens the page. `render_html` / `render_markdown`
turn it into text. Times carry their time zone; the page's tables sort and filter with a
small inline script (no network). The page
links every artifact relative to itself: each run's folder and the files in it (logs,
hang.md from the hang forensics, the tripwire diagnosis, evidence.json), so the page and
the store's artifacts/ folder can be moved together. More in docs/campaigns.md.
"""
from __future__ import annotations

import base64
import dataclasses
import html
import json
import os
import re
import shlex
import statistics
import time
import urllib.parse
from pathlib import Path
from typing import Any, Collection

from .loop import WorkItem
from .extras import MissingExtra, install_hint
from .forensics.policy import forensics_words
from .outcome import Outcome, RunResult, item_key
from .stats import format_rate, rate_ci, upper_bound
from .store import Store, StoredRun, empty_counts
from .junit import JUnitSuite
from .telemetry import APPLICATION_XIDS, hardware_suspect
from .verdict import Expect, ItemTally, Judgement, Proof, judge

REPORT_EXTRA_HINT = install_hint("reports")


class ReportExtraMissing(MissingExtra):
    """jinja2 or matplotlib (the `reports` extra) is not installed."""
LINKED_RUNS_PER_ROW = 3   # failing runs of a row linked in the table (the signatures link the rest)
FILES_PER_RUN = 10        # files of a run folder listed by name (the folder link shows them all)
STDERR_LINES = 15         # last lines of an example run's stderr shown per signature


def report_modules() -> tuple[Any, Any]:
    """(jinja2, the figures module) for the HTML report; a one-line UserError naming the
    `reports` extra when they are not installed."""
    try:
        import jinja2

        from . import report_figures
    except ImportError as e:
        raise ReportExtraMissing(f"the HTML report needs jinja2 and matplotlib ({e.name or e} is missing): "
                        f"{REPORT_EXTRA_HINT}") from None
    return jinja2, report_figures


@dataclasses.dataclass
class RunArtifacts:
    """One stored run and its artifact folder (None when it kept none, or it is gone), with
    the files in it: (what the file is, its path), the telling ones first."""

    seq: int
    outcome: str
    reason: str
    folder: Path | None
    files: list[tuple[str, Path]] = dataclasses.field(default_factory=list)
    more_files: int = 0
    note: str = ""   # why there is no folder to link

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "outcome": self.outcome, "reason": self.reason,
                "artifact_dir": str(self.folder) if self.folder else None,
                "files": [{"what": w, "path": str(p)} for w, p in self.files], "more_files": self.more_files,
                "note": self.note}


_FILE_KINDS = (  # (test on the file name, what it is), in the order a reader wants them
    (lambda n: n == "hang.md", "hang report"),
    (lambda n: n.startswith("tripwire-") and n.endswith(".txt"), "tripwire diagnosis"),
    (lambda n: n == "evidence.json", "evidence"),
    (lambda n: n.endswith(".log"), "log"),
    (lambda n: n.startswith("hang"), "hang forensics"),
    (lambda n: n.startswith("tripwire-"), "tripwire snapshot"),
    (lambda n: True, "file"),
)


def _file_kind(name: str) -> tuple[int, str]:
    return next((i, what) for i, (test, what) in enumerate(_FILE_KINDS) if test(name))


def find_artifact_folder(store: Store, stored: str | None) -> Path | None:
    """Where a run's stored artifact folder is now: as stored when it exists, else the same
    place under this store's artifacts/ (a relative path stored by an older version, or a
    store moved with its artifacts); None when there is none."""
    if not stored:
        return None
    p = Path(stored)
    if p.is_dir():
        return p.absolute()
    parts = p.parts
    if "artifacts" in parts:
        tail = parts[len(parts) - 1 - parts[::-1].index("artifacts"):]
        moved = store.path.absolute().parent.joinpath(*tail)
        if moved.is_dir():
            return moved
    return None


def run_artifacts(store: Store, sr: StoredRun) -> RunArtifacts:
    """The run with its artifact folder and the files in it."""
    r = sr.result
    folder = find_artifact_folder(store, r.artifact_dir)
    out = RunArtifacts(sr.seq, Outcome(r.outcome).value, r.reason or "", folder)
    if folder is None:
        out.note = "folder no longer exists" if r.artifact_dir else "no artifacts kept (--artifacts none)"
        return out
    files = sorted((p for p in folder.rglob("*") if p.is_file()),
                   key=lambda p: (_file_kind(p.name)[0], str(p.relative_to(folder))))
    out.files = [(_file_kind(p.name)[1], p) for p in files[:FILES_PER_RUN]]
    out.more_files = max(0, len(files) - FILES_PER_RUN)
    return out


TEMPLATES = Path(__file__).resolve().parent / "templates"


@dataclasses.dataclass(kw_only=True)
class KeyRow(ItemTally):
    """One target/variant of the campaign: its runs counted with its proof (n, failures,
    judged, rate(), ci() from OutcomeCounts), what was expected of it, and the verdict."""

    target: str
    variant: str
    expect: Expect | None
    first_failure_s: float | None = None   # that key's own running time to its first failure
    first_failure_run: int | None = None
    kernel_ms_median: float | None = None
    launches: int = 0
    busy_s: float = 0.0
    ttf_samples: list[float] = dataclasses.field(default_factory=list)
    kernel_ms: list[float] = dataclasses.field(default_factory=list)
    linked: list[RunArtifacts] = dataclasses.field(default_factory=list)  # its first failing (else error) runs
    linked_of: int = 0  # how many runs of the kind linked it had (the rest are "N more")

    @property
    def label(self) -> str:
        return item_key(self.target, self.variant)

    verdict: Judgement | None = None  # set by build_report (a soak's: against the store's history)

    @property
    def judgement(self) -> Judgement:
        return self.verdict if self.verdict is not None else judge(self.expect, self)


@dataclasses.dataclass
class GpuRow:
    """One GPU's line of the telemetry table."""

    uuid: str
    runs: int = 0
    failures: int = 0
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    xids: list[int] = dataclasses.field(default_factory=list)
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0


@dataclasses.dataclass
class TrendPoint:
    """One campaign's failures of one target/variant, at the date the campaign started."""

    when: float
    campaign_id: int
    failures: int
    judged: int

    @property
    def rate(self) -> float:
        return self.failures / self.judged

    def ci(self, conf: float = 0.95) -> tuple[float, float]:
        """The exact two-sided interval (with no failure: 0 up to the one-sided bound)."""
        if self.failures == 0:
            return 0.0, upper_bound(0, self.judged, conf)
        return rate_ci(self.failures, self.judged, conf)

    @property
    def text(self) -> str:
        return format_rate(self.failures, self.judged)


@dataclasses.dataclass
class Report:
    """Everything a report shows about one campaign."""

    campaign: Any
    rows: list[KeyRow]
    gpus: list[GpuRow]
    signatures: list[dict[str, Any]]
    changes: list[dict[str, Any]]
    previous_id: int | None
    trend: dict[str, list[TrendPoint]]
    hint: str | None
    notes: list[str]
    context: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    campaign_files: list[Path] = dataclasses.field(default_factory=list)  # e.g. repro-context.json
    figures: dict[str, str] = dataclasses.field(default_factory=dict)
    generated_at: float = dataclasses.field(default_factory=time.time)
    previous_created: float | None = None  # when the campaign compared with started
    # `hazards mutate`: its session's score and every mutant's fate (`mutation_summary`)
    mutation: dict[str, Any] | None = None

    @property
    def news(self) -> dict[str, list[Any]]:
        """What is new since the previous campaign of its kind: failure signatures never seen
        before in the store, items that regressed or went blind, significant rate rises."""
        bad = ("regressed", "went blind", "failed")
        flagged = [r for r in self.rows if r.judgement.verdict.value in bad]
        said = {r.label for r in flagged}  # a regressed item's verdict already names its rate rise
        return {"signatures": [s for s in self.signatures if s["new"]], "flagged": flagged,
                "rose": [ch for ch in self.changes if ch.get("direction") == "rose"
                         and item_key(ch["target"], ch["variant"]) not in said]}

    @property
    def trend_dates(self) -> list[tuple[float, int]]:
        """(date, campaign id) of every campaign in the trends, oldest first."""
        return sorted({(p.when, p.campaign_id) for pts in self.trend.values() for p in pts})

    @property
    def counts(self) -> dict[str, int]:
        out = empty_counts()
        for r in self.rows:
            for o, c in r.counts.items():
                out[o] += c
        return out


def _collect(store: Store, campaign_id: int) -> tuple[list[KeyRow], dict[str, GpuRow], dict[int, StoredRun]]:
    """The rows (every work item of the spec, run or not; a run of anything the spec does
    not list, such as a `hazards run` command, is expected clean), the GPUs and
    {signature id: the campaign's first run with it}."""
    from .soak import item_expectations

    camp = store.campaign(campaign_id)
    expected = item_expectations(camp.spec)
    rows: dict[tuple[str, str], KeyRow] = {}
    since_fail: dict[tuple[str, str], float] = {}
    gpus: dict[str, GpuRow] = {}
    examples: dict[int, StoredRun] = {}
    error_runs: dict[tuple[str, str], list[StoredRun]] = {}
    for sr in store.iter_runs(campaign_id):
        r = sr.result
        key = (r.target, r.variant)
        expect, proof = expected.get(r.key, (Expect.CLEAN, Proof()))
        row = rows.setdefault(key, KeyRow(target=r.target, variant=r.variant, expect=expect))
        outcome = Outcome(r.outcome)
        row.add(r, proof)
        if sr.signature_id is not None:
            examples.setdefault(sr.signature_id, sr)
        if outcome.is_failure and len(row.linked) < LINKED_RUNS_PER_ROW:
            row.linked.append(run_artifacts(store, sr))
        elif outcome is Outcome.ERROR and len(error_runs.setdefault(key, [])) < LINKED_RUNS_PER_ROW:
            error_runs[key].append(sr)
        if outcome.is_failure:
            row.linked_of += 1
        launches = r.metrics.get("launches")
        if isinstance(launches, int):
            row.launches += launches
        km = r.metrics.get("kernel_ms")
        if isinstance(km, (int, float)) and km >= 0:
            row.kernel_ms.append(float(km))
        row.busy_s += max(0.0, r.duration_s or 0.0)
        since_fail[key] = since_fail.get(key, 0.0) + max(0.0, r.duration_s or 0.0)
        if outcome.is_failure:
            row.ttf_samples.append(since_fail[key])
            since_fail[key] = 0.0
            if row.first_failure_run is None:
                row.first_failure_run, row.first_failure_s = row.n, row.ttf_samples[0]
        tel = r.evidence.get("telemetry") if isinstance(r.evidence, dict) else None
        uuid = r.gpu_uuid or (tel or {}).get("uuid")
        if uuid:
            g = gpus.setdefault(uuid, GpuRow(uuid))
            g.runs += 1
            g.failures += int(outcome.is_failure)
            if isinstance(tel, dict):
                g.info.update({k: v for k, v in tel.items() if k not in ("xids", "ecc_corrected", "ecc_uncorrected")})
                g.xids.extend(int(x) for x in tel.get("xids", ()) if isinstance(x, int))
                g.ecc_corrected += int(tel.get("ecc_corrected") or 0)
                g.ecc_uncorrected += int(tel.get("ecc_uncorrected") or 0)
    for item in (WorkItem.from_json(i) for i in camp.spec.get("items", []) if isinstance(i, dict)):
        rows.setdefault((item.target, item.variant), KeyRow(target=item.target, variant=item.variant,
                                                            expect=item.expectation))
    for key, row in rows.items():
        if row.kernel_ms:
            row.kernel_ms_median = statistics.median(row.kernel_ms)
        if not row.linked:  # a row with only error runs links those
            row.linked = [run_artifacts(store, sr) for sr in error_runs.get(key, [])]
            row.linked_of = row.counts.get(Outcome.ERROR.value, 0)
    summary = camp.spec.get("telemetry") or {}
    for uuid, s in summary.items() if isinstance(summary, dict) else ():
        g = gpus.setdefault(uuid, GpuRow(uuid))
        g.info.update({k: v for k, v in s.items() if k not in ("xids", "ecc_corrected", "ecc_uncorrected")})
        # the campaign-wide counters include what fell between runs: take the larger
        g.ecc_corrected = max(g.ecc_corrected, int(s.get("ecc_corrected") or 0))
        g.ecc_uncorrected = max(g.ecc_uncorrected, int(s.get("ecc_uncorrected") or 0))
        xs = [int(x["xid"]) for x in s.get("xids", ()) if isinstance(x, dict) and "xid" in x]
        if len(xs) > len(g.xids):
            g.xids = xs
    return sorted(rows.values(), key=lambda k: (k.target, k.variant)), gpus, examples


def _trend(store: Store, campaign: Any, last: int) -> dict[str, list[TrendPoint]]:
    """{target/variant: one point per campaign} over the last `last` campaigns of its kind,
    dated by when each campaign started."""
    recent = [c for c in store.campaigns(campaign.kind) if c.id <= campaign.id][-max(1, last):]
    series: dict[str, list[TrendPoint]] = {}
    for c in recent:
        for t in store.tally(c.id):
            if t.judged:
                series.setdefault(item_key(t.target, t.variant), []).append(
                    TrendPoint(c.created, c.id, t.failures, t.judged))
    return series


def _context(camp: Any) -> list[dict[str, Any]]:
    """One entry per session of the campaign: when, the command, its folder and `git
    describe`, host, versions, GPUs (name and UUID) and driver; None where the session did
    not record it (campaigns stored by older versions)."""
    out = []
    for s in camp.spec.get("sessions", []) or [{}]:
        if not isinstance(s, dict):
            continue
        gpus = [" ".join(str(x) for x in (g.get("name"), g.get("uuid") or g.get("gpu")) if x)
                for g in s.get("gpus", []) if isinstance(g, dict)]
        out.append({"started": s.get("started", camp.created), "command": s.get("command"),
                    "cwd": s.get("cwd", camp.spec.get("cwd")), "git_describe": s.get("git_describe"),
                    "host": s.get("host", camp.host), "hazards_version": s.get("hazards_version"),
                    "python": s.get("python"), "gpus": gpus, "driver": s.get("driver"),
                    "telemetry": s.get("telemetry")})
    return out


def build_report(store: Store, campaign_id: int, *, last: int = 10, figures: bool = True,
                 families: Collection[str] = ()) -> Report:
    """Gather one campaign's report data (and render its figures unless `figures=False`).
    `families`: the catalog's family names, whose launch-server items are reproduced with
    `hazards repro --family` (the engine does not import the catalog to know them)."""
    from .soak import KIND as SOAK, compare_campaigns, soak_judgements

    camp = store.campaign(campaign_id)
    rows, gpus, examples = _collect(store, campaign_id)
    cmp = compare_campaigns(store, campaign_id)
    if camp.kind == SOAK:  # the soak's own verdicts, so that its exit code and this report agree
        verdicts = soak_judgements(store, campaign_id, cmp)
        for row in rows:
            row.verdict = verdicts[row.label][1]
    else:  # what the campaign's items were dropped for (after repeated errors)
        dropped = camp.spec.get("dropped") or {}
        for row in rows:
            row.verdict = judge(row.expect, row, dropped=dropped.get(row.label))
    new_keys = {s.key for s in cmp.new_signatures}
    seen = {s.id: (s.first_seen, s.last_seen) for s in store.signatures()}  # in the whole store
    sigs = []
    for s in store.signatures(campaign_id):
        example = examples.get(s.id)
        triage = _triage(camp.spec, example.result if example is not None else None, families)
        sigs.append({**triage, "more": max(0, s.count - 1),"id": s.id, "outcome": s.outcome, "error_kind": s.error_kind, "target": s.target,
                     "variant": s.variant, "label": item_key(s.target, s.variant), "message": s.message, "count": s.count, "new": s.key in new_keys,
                     "first_seen": seen.get(s.id, (s.first_seen,))[0],
                     "last_seen": seen.get(s.id, (None, s.last_seen))[1],
                     "example": run_artifacts(store, example) if example is not None else None,
                     "hang_md": _hang_md(store, example) if s.outcome == "hang" and example is not None else None})
    hint = hardware_suspect({u: {"runs": g.runs, "failures": g.failures, "xids": g.xids,
                                 "ecc_corrected": g.ecc_corrected, "ecc_uncorrected": g.ecc_uncorrected}
                             for u, g in gpus.items()})
    notes = list(camp.spec.get("notes", [])) if isinstance(camp.spec.get("notes"), list) else []
    root = store.layout.artifacts(campaign_id)
    rep = Report(camp, rows, sorted(gpus.values(), key=lambda g: g.uuid), sigs,
                 [dataclasses.asdict(c) for c in cmp.changes], cmp.previous_id, _trend(store, camp, last), hint,
                 notes, _context(camp), sorted(p for p in root.iterdir() if p.is_file()) if root.is_dir() else [],
                 previous_created=store.campaign(cmp.previous_id).created if cmp.previous_id is not None else None)
    rep.mutation = mutation_summary(store, camp)
    if figures:
        rep.figures = render_figures(rep)
    return rep


def mutation_summary(store: Store, camp: Any) -> dict[str, Any] | None:
    """The mutation session a campaign belongs to (`hazards mutate` keeps its summary on the
    session's baseline campaign; each mutant's campaign names it as `session`): `session`,
    `score` {killed, judged, mutants}, `fates` (count per fate), `mutants` (each one's fate,
    evidence and bound) and `survivors` (those with their diff). None for any other campaign;
    without a summary (the command was interrupted) `score` is None and `note` says why."""
    spec = camp.spec if isinstance(camp.spec, dict) else {}
    if "mutation" in spec:
        session, summary = camp.id, spec["mutation"]
    elif "session" in spec and "mutant" in spec:
        session = int(spec["session"])
        try:
            summary = store.campaign(session).spec.get("mutation")
        except Exception:  # the session's campaign was deleted: say so rather than guess
            summary = None
    else:
        return None
    if not isinstance(summary, dict):
        return {"session": session, "score": None, "fates": {}, "mutants": [], "survivors": [],
                "note": f"no mutation summary on campaign {session}: the mutate command did not finish"}
    mutants = list(summary.get("mutants") or [])
    fates: dict[str, int] = {}
    for m in mutants:
        fates[m.get("fate", "?")] = fates.get(m.get("fate", "?"), 0) + 1
    return {"session": session, "score": summary.get("score"), "fates": fates, "mutants": mutants,
            "survivors": [m for m in mutants if m.get("fate") == "survived"], "note": ""}


def mutation_score_text(score: dict[str, Any] | None) -> str:
    """'7 of 9 judged mutants killed (78%); 12 mutants in all' (the words `hazards mutate` prints)."""
    if not score:
        return "no score"
    killed, judged = int(score.get("killed", 0)), int(score.get("judged", 0))
    pct = f"{100 * killed / judged:.0f}%" if judged else "n/a"
    return f"{killed} of {judged} judged mutants killed ({pct}); {score.get('mutants', 0)} mutants in all"


_DIAGNOSTIC_EVIDENCE = (  # where a run's evidence says what went wrong, the most specific first
    ("fault_signature", "line"), ("python_exception", None), ("infra_signature", "line"),
    ("regex_match", "line"), ("result", "line"), ("message", None))


def diagnostic_line(result: RunResult) -> str:
    """The one line that says what went wrong in a run: the fault signature it matched, its
    uncaught exception, the infrastructure signature, the output line a regex matched, its
    failing result line or the server's message; else its reason."""
    ev = result.evidence if isinstance(result.evidence, dict) else {}
    for key, field in _DIAGNOSTIC_EVIDENCE:
        value = ev.get(key)
        if field is not None:
            value = value.get(field) if isinstance(value, dict) else None
        if isinstance(value, str) and value.strip():
            return " ".join(value.split())
    return result.reason or ""


def stderr_tail(result: RunResult, lines: int = STDERR_LINES) -> tuple[list[str], int]:
    """(the last `lines` lines of the run's kept stderr, how many lines were kept)."""
    text = (result.evidence or {}).get("stderr_tail") if isinstance(result.evidence, dict) else None
    kept = text.rstrip("\n").splitlines() if isinstance(text, str) and text.strip() else []
    return kept[-lines:], len(kept)


def repro_line(spec: dict[str, Any], result: RunResult, families: Collection[str] = ()) -> str | None:
    """The `hazards repro` command that reruns this run's target until it fails, rebuilt
    from the campaign's stored work item (or a run/repro campaign's command); None for what
    `hazards repro` cannot run (a registered server target, a sanitizer item)."""
    items = [WorkItem.from_json(i) for i in spec.get("items", []) if isinstance(i, dict)]
    item = next((i for i in items if (i.target, i.variant) == (result.target, result.variant)), None)
    if item is not None:
        if item.kind == "server" and item.target in families:
            return _family_repro(item.target, {**item.params, **(result.params or {})}, item.timeout_s)
        if item.kind != "command" or item.sanitizer:
            return None
        return _command_repro(list(item.argv), item.cwd, item.env, item.timeout_s)
    if spec.get("family") and spec["family"] in families:
        return _family_repro(spec["family"], dict(spec.get("params") or {}), spec.get("timeout"))
    if spec.get("argv"):
        return _command_repro(list(spec["argv"]), spec.get("cwd"), {}, spec.get("timeout"))
    return None


def _family_repro(family: str, params: dict[str, Any], timeout: float | None) -> str:
    rest = {k: v for k, v in params.items() if k != "variant"}
    argv = ["hazards", "repro", "--family", family]
    argv += ["--variant", str(params["variant"])] if params.get("variant") else []
    argv += ["--params", json.dumps(rest, sort_keys=True, separators=(",", ":"))] if rest else []
    argv += ["--timeout", f"{timeout:g}"] if timeout else []
    return shlex.join(argv)


def _command_repro(argv: list[str], cwd: str | None, env: dict[str, str], timeout: float | None) -> str:
    line = shlex.join(["hazards", "repro", *(["--timeout", f"{timeout:g}"] if timeout else []), "--", *argv])
    if env:
        line = shlex.join(["env", *(f"{k}={v}" for k, v in sorted(env.items()))]) + " " + line
    return f"cd {shlex.quote(cwd)} && {line}" if cwd else line


def _triage(spec: dict[str, Any], example: RunResult | None, families: Collection[str]) -> dict[str, Any]:
    """What a signature's example run gives triage: its diagnostic line, the end of its
    stderr, and the command that reproduces it."""
    if example is None:
        return {"diagnostic": "", "stderr_tail": [], "stderr_lines": 0, "repro": None}
    tail, kept = stderr_tail(example)
    return {"diagnostic": diagnostic_line(example), "stderr_tail": tail, "stderr_lines": kept,
            "repro": repro_line(spec, example, families)}


def _hang_md(store: Store, example: StoredRun) -> str | None:
    """The hang.md of a hang signature's example run (its first in the campaign: the one
    that got the full collection when the item's hang was new), None when it has none."""
    folder = find_artifact_folder(store, example.result.artifact_dir)
    md = folder / "hang.md" if folder is not None else None
    return str(md) if md is not None and md.is_file() else None


def render_figures(rep: Report) -> dict[str, str]:
    """{name: base64 PNG} for every figure that has data."""
    _, figs = report_modules()
    labels = [r.label for r in rep.rows]
    pngs = {
        "outcomes": figs.outcome_bars(labels, [r.counts for r in rep.rows]),
        "rates": figs.rate_intervals(labels, [r.rate() for r in rep.rows],
                                     [r.ci() if r.judged else (0.0, 1.0) for r in rep.rows]),
        "trend": figs.trends(rep.trend),
        "ttf": figs.distributions({r.label: r.ttf_samples for r in rep.rows}, log=True,
                                  title="Time to failure (running time of that variant, first and between failures)",
                                  xlabel="seconds"),
        "kernel": figs.distributions({r.label: r.kernel_ms for r in rep.rows}, log=True,
                                     title="Kernel time per request", xlabel="ms"),
    }
    return {k: base64.b64encode(v).decode("ascii") for k, v in pngs.items() if v}


def _fmt_rate(row: KeyRow) -> str:
    return format_rate(row.failures, row.judged)


def _gpu_cells(g: GpuRow) -> dict[str, str]:
    i = g.info
    clock = (f"{i.get('sm_mhz_min')}–{i.get('sm_mhz_max')}" if "sm_mhz_min" in i
             else str(i.get("sm_mhz", "")))
    bad = sorted({x for x in g.xids if x not in APPLICATION_XIDS})
    return {
        "uuid": g.uuid, "name": str(i.get("name", "")), "driver": str(i.get("driver", "")),
        "runs": str(g.runs), "failures": str(g.failures), "sm_mhz": clock,
        "temp_c": str(i.get("temp_c_max", i.get("temp_c", ""))),
        "power_w": str(i.get("power_w_max", i.get("power_w", ""))),
        "throttle": ", ".join(i.get("throttle", ()) or ()) or "—",
        "ecc": f"+{g.ecc_corrected} / +{g.ecc_uncorrected}",
        "xids": (", ".join(str(x) + ("" if x in APPLICATION_XIDS else " (hw)") for x in sorted(set(g.xids)))
                 or "none") + ("" if i.get("xid_watch", "on") == "on" else f" ({i.get('xid_watch')})"),
        "suspect": "yes" if bad or g.ecc_uncorrected else "",
    }


def _when(t: float | None, *, seconds: bool = True) -> str:
    """A stored time in the reader's local time with its zone: '2026-12-05 10:12:04 CET (+01:00)'."""
    if not t:
        return "—"
    local = time.localtime(t)
    offset = time.strftime("%z", local)
    zone = time.strftime("%Z", local)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M", local)
    return f"{stamp} {zone} ({offset[:3]}:{offset[3:]})" if zone and not zone.startswith(("+", "-")) \
        else f"{stamp} {offset[:3]}:{offset[3:]}"


def _iso(t: float | None) -> str:
    """A stored time as ISO 8601 with its offset (a <time datetime> value, a sort key)."""
    import datetime

    return datetime.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds") if t else ""


def _link(base: Path | None):
    """href of a path as seen from a page in `base` (relative, URL-quoted; a folder ends in /)."""
    def link(path: Path) -> str:
        p = Path(path).absolute()
        rel = os.path.relpath(p, base.absolute()) if base is not None else None
        href = urllib.parse.quote(rel.replace(os.sep, "/")) if rel is not None else p.as_uri()
        return href + ("/" if p.is_dir() and not href.endswith("/") else "")
    return link


def render_html(rep: Report, base: str | os.PathLike[str] | None = None) -> str:
    """The report as one self-contained HTML page (figures inline, no network access);
    artifact links relative to `base`, the folder the page is written to (absolute file
    URLs without one)."""
    jinja2, _ = report_modules()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=jinja2.select_autoescape(["html", "j2"]),
                             undefined=jinja2.StrictUndefined)
    return env.get_template("report.html.j2").render(
        rep=rep, c=rep.campaign, counts=rep.counts, rows=rep.rows, fmt_rate=_fmt_rate,
        mutation_score_text=mutation_score_text,
        gpus=[_gpu_cells(g) for g in rep.gpus], when=_when, iso=_iso, esc=html.escape,
        link=_link(Path(base) if base is not None else None))


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "|<>&"})


def md_text(value: Any) -> str:
    """Text as it must appear in a markdown table cell or list item, one line: markdown's
    own backslash escapes for `|` (it would end the cell) and `<` `>` `&` (a job summary
    would render a tag or an entity). No HTML entities:
    `hazards soak` prints this summary on the terminal too, where `&lt;n&gt;` is noise."""
    return " ".join(str(value).translate(_MD_SPECIAL).split())


def render_markdown(rep: Report) -> str:
    """A short markdown summary (CI logs, job summaries); every text from the runs escaped."""
    c = rep.campaign
    counts = ", ".join(f"{o} {n}" for o, n in rep.counts.items() if n)
    out = [f"## hazards {c.kind} campaign {c.id}" + (f" ({md_text(c.name)})" if c.name else ""),
           "", f"{_when(c.created)} on {md_text(c.host)}, status **{c.status}**; runs: {counts or 'none'}", ""]
    for ctx in rep.context[-1:]:
        facts = [f"`{md_text(ctx[k])}`" if k == "command" else md_text(ctx[k])
                 for k in ("command", "git_describe") if ctx.get(k)]
        facts += [md_text(", ".join(ctx["gpus"]))] if ctx.get("gpus") else []
        facts += [f"driver {md_text(ctx['driver'])}"] if ctx.get("driver") else []
        if facts:
            out += ["Ran " + "; ".join(facts), ""]
    if rep.rows:
        out += ["| target/variant | expect | runs | clean | hang | fault | mismatch | error | failure rate "
                "| verdict |", "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in rep.rows:
            k = r.counts
            out.append(f"| {md_text(r.label)} | {r.expect or '-'} | {r.n} | {k['clean']} | {k['hang']} "
                       f"| {k['fault']} | {k['mismatch']} | {k['error']} | {_fmt_rate(r)} "
                       f"| {r.judgement.verdict} |")
        out.append("")
    new = [s for s in rep.signatures if s["new"]]
    if new or rep.previous_id is not None:
        head = f"{len(new)} failure signature(s) never seen before in the store"
        if rep.previous_id is not None:
            head += (f"; compared with campaign {rep.previous_id}: {len(rep.changes)} significant rate "
                     "change(s) (Holm-corrected)")
        out.append(head + ".")
        for s in new:
            out.append(f"- NEW {s['outcome']} in {md_text(s['label'])}: "
                       f"{md_text(s['message'])} (x{s['count']})"
                       + (f"; hang.md: {md_text(s['hang_md'])}" if s.get("hang_md") else ""))
            if s.get("repro"):
                out.append(f"  reproduce: `{md_text(s['repro'])}`")
        for ch in rep.changes:
            out.append(f"- {md_text(item_key(ch['target'], ch['variant']))}: {md_text(ch['verdict'])}"
                       + (" (regression)" if ch.get("regression") else ""))
        out.append("")
    out += _mutation_markdown(rep.mutation)
    spent = forensics_words(c.spec.get("forensics"))
    if spent:
        out += [md_text(spent), ""]
    if rep.hint:
        out += [f"**{md_text(rep.hint)}**", ""]
    for note in rep.notes:
        out.append(f"- {md_text(note)}")
    return "\n".join(out).rstrip() + "\n"


def _mutation_markdown(mutation: dict[str, Any] | None) -> list[str]:
    """The mutation section of the markdown summary: the score, then each survivor with its
    bound and its diff in a fence longer than any run of backticks inside it."""
    if mutation is None:
        return []
    out = [f"### Mutation score (session campaign {mutation['session']})", ""]
    if mutation["score"] is None:
        return out + [md_text(mutation["note"]), ""]
    fates = ", ".join(f"{f} {n}" for f, n in sorted(mutation["fates"].items()))
    out += [f"**{mutation_score_text(mutation['score'])}**" + (f" ({md_text(fates)})" if fates else ""), ""]
    for m in mutation["survivors"]:
        out += [f"- survived: `{md_text(m.get('id'))}` {md_text(m.get('path'))}:{m.get('line')}: "
                f"{md_text(m.get('description'))}; {md_text(m.get('bound'))}", ""]
        diff = str(m.get("diff") or "")
        ticks = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", diff)), default=0))
        out += [f"{ticks}diff", diff.rstrip("\n"), ticks, ""]
    return out


def report_json(rep: Report) -> dict[str, Any]:
    """The report as one JSON object (`hazards report --json`, `hazards soak --json`): the
    campaign, its counts, one row per target/variant with its rate and verdict, the GPUs,
    the failure signatures and the significant changes against the previous campaign."""
    c = rep.campaign
    rows = [{"target": r.target, "variant": r.variant, "expect": r.expect.value if r.expect else None,
             "runs": r.n, "counts": dict(r.counts), "failures": r.failures, "judged": r.judged,
             "rate": r.rate(), "ci_95": list(r.ci()) if r.judged else None,
             "rate_text": format_rate(r.failures, r.judged), "verdict": r.judgement.verdict.value,
             "message": r.judgement.message, "launches": r.launches,
             "first_failure_s": r.first_failure_s, "kernel_ms_median": r.kernel_ms_median,
             "runs_linked": [a.to_json() for a in r.linked]} for r in rep.rows]
    sigs = [{**s, "example": s["example"].to_json() if s["example"] else None} for s in rep.signatures]
    trend = {k: [{"when": p.when, "campaign": p.campaign_id, "failures": p.failures, "judged": p.judged,
                  "rate": p.rate, "ci_95": list(p.ci()), "rate_text": p.text} for p in pts]
             for k, pts in rep.trend.items()}
    return {"campaign": {"id": c.id, "kind": c.kind, "name": c.name, "status": c.status,
                         "created": c.created, "host": c.host},
            "context": rep.context, "counts": rep.counts, "rows": rows,
            "gpus": [dataclasses.asdict(g) for g in rep.gpus],
            "signatures": sigs, "previous_id": rep.previous_id, "changes": rep.changes, "trend": trend,
            "hint": rep.hint, "notes": list(rep.notes), "mutation": rep.mutation}


def junit_suites(rep: Report) -> list[JUnitSuite]:
    """The campaign as JUnit: one case per target/variant (every work item, run or not)
    with the verdict the command itself gave (a soak's: `soak_judgements`, so the JUnit
    file fails exactly what made the soak exit non-zero): a canary fails as "went-blind",
    a clean item as "failed" (a soak's as "regressed"; a known hazard passes), an item
    with no judged run is an error."""
    c = rep.campaign
    suite = JUnitSuite(f"hazards.{c.kind}", started_at=c.created, stdout=render_markdown(rep),
                       properties={"campaign": str(c.id), "host": c.host, "status": c.status})
    for r in rep.rows:
        name = r.label + (f" ({r.expect.noun})" if r.expect else "")
        suite.cases.append(r.judgement.junit_case(name, f"hazards.{c.kind}.{r.target}", r.busy_s))
    return [suite]


def write_report(store: Store, campaign_id: int, out: str | Path, *, last: int = 10,
                 families: Collection[str] = ()) -> Report:
    """Build the report and write it as HTML to `out` (atomically); returns the data. A
    UserError naming the `reports` extra, before anything is written, without jinja2 or
    matplotlib. `families` as for `build_report`."""
    report_modules()
    rep = build_report(store, campaign_id, last=last, families=families)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_html(rep, base=path.parent), encoding="utf-8")
    tmp.replace(path)
    return rep
