"""Campaign reports: an HTML page with embedded figures, a markdown summary for CI logs.

`build_report(store, campaign_id)` gathers everything from the store: outcome counts and
failure rates with exact 95% intervals per target/variant, trends over the last N
campaigns of the same kind, time-to-failure and kernel-time distributions, the GPU
telemetry table (from each run's `evidence["telemetry"]` plus the campaign's telemetry
summary), failure signatures marked new against the previous campaign of the same kind,
and significant rate changes. `render_html` / `render_markdown` turn it into text.
"""
from __future__ import annotations

import base64
import dataclasses
import html
import statistics
import time
from pathlib import Path
from typing import Any

import jinja2

from hazards.engine import report_figures as figs
from hazards.engine.executor import WorkItem
from hazards.engine.outcome import Outcome, item_key
from hazards.engine.stats import format_rate
from hazards.engine.store import Store, empty_counts
from hazards.engine.junit import JUnitSuite
from hazards.engine.telemetry import APPLICATION_XIDS, hardware_suspect
from hazards.engine.verdict import Expect, ItemTally, Judgement, Proof, judge

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

    @property
    def label(self) -> str:
        return item_key(self.target, self.variant)

    @property
    def judgement(self) -> Judgement:
        return judge(self.expect, self)


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
class Report:
    """Everything a report shows about one campaign."""

    campaign: Any
    rows: list[KeyRow]
    gpus: list[GpuRow]
    signatures: list[dict[str, Any]]
    changes: list[dict[str, Any]]
    previous_id: int | None
    trend: dict[str, list[tuple[int, float, float, float]]]
    hint: str | None
    notes: list[str]
    figures: dict[str, str] = dataclasses.field(default_factory=dict)
    generated_at: float = dataclasses.field(default_factory=time.time)

    @property
    def counts(self) -> dict[str, int]:
        out = empty_counts()
        for r in self.rows:
            for o, c in r.counts.items():
                out[o] += c
        return out


def _expectations(spec: dict[str, Any]) -> dict[str, tuple[Expect | None, Proof]]:
    """{target/variant: (expectation, proof)} of the campaign's work items. A run of
    anything the spec does not list (a `hazards run` command) is expected clean."""
    items = [WorkItem.from_json(i) for i in spec.get("items", []) if isinstance(i, dict)]
    return {i.key: (i.expectation, i.proof) for i in items}


def _collect(store: Store, campaign_id: int) -> tuple[list[KeyRow], dict[str, GpuRow]]:
    camp = store.campaign(campaign_id)
    expected = _expectations(camp.spec)
    rows: dict[tuple[str, str], KeyRow] = {}
    since_fail: dict[tuple[str, str], float] = {}
    gpus: dict[str, GpuRow] = {}
    for sr in store.iter_runs(campaign_id):
        r = sr.result
        key = (r.target, r.variant)
        expect, proof = expected.get(r.key, (Expect.CLEAN, Proof()))
        row = rows.setdefault(key, KeyRow(target=r.target, variant=r.variant, expect=expect))
        outcome = Outcome(r.outcome)
        row.add(r, proof)
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
    for row in rows.values():
        if row.kernel_ms:
            row.kernel_ms_median = statistics.median(row.kernel_ms)
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
    return sorted(rows.values(), key=lambda k: (k.target, k.variant)), gpus


def _trend(store: Store, campaign: Any, last: int) -> dict[str, list[tuple[int, float, float, float]]]:
    recent = [c for c in store.campaigns(campaign.kind) if c.id <= campaign.id][-max(1, last):]
    series: dict[str, list[tuple[int, float, float, float]]] = {}
    for c in recent:
        for t in store.tally(c.id):
            if t.judged:
                lo, hi = t.ci()
                label = item_key(t.target, t.variant)
                series.setdefault(label, []).append((c.id, t.rate(), lo, hi))
    return series


def build_report(store: Store, campaign_id: int, *, last: int = 10, figures: bool = True) -> Report:
    """Gather one campaign's report data (and render its figures unless `figures=False`)."""
    from hazards.engine.soak import compare_campaigns  # soak builds on the store too; no cycle at import

    camp = store.campaign(campaign_id)
    rows, gpus = _collect(store, campaign_id)
    cmp = compare_campaigns(store, campaign_id)
    new_keys = {s.key for s in cmp.new_signatures} if cmp else set()
    sigs = [{"outcome": s.outcome, "error_kind": s.error_kind, "target": s.target, "variant": s.variant,
             "message": s.message, "count": s.count, "new": s.key in new_keys}
            for s in store.signatures(campaign_id)]
    hint = hardware_suspect({u: {"runs": g.runs, "failures": g.failures, "xids": g.xids,
                                 "ecc_corrected": g.ecc_corrected, "ecc_uncorrected": g.ecc_uncorrected}
                             for u, g in gpus.items()})
    notes = list(camp.spec.get("notes", [])) if isinstance(camp.spec.get("notes"), list) else []
    rep = Report(camp, rows, sorted(gpus.values(), key=lambda g: g.uuid), sigs,
                 [dataclasses.asdict(c) for c in cmp.changes] if cmp else [],
                 cmp.previous_id if cmp else None, _trend(store, camp, last), hint, notes)
    if figures:
        rep.figures = render_figures(rep)
    return rep


def render_figures(rep: Report) -> dict[str, str]:
    """{name: base64 PNG} for every figure that has data."""
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


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def render_html(rep: Report) -> str:
    """The report as one self-contained HTML page (figures inline, no network access)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=jinja2.select_autoescape(["html", "j2"]),
                             undefined=jinja2.StrictUndefined)
    return env.get_template("report.html.j2").render(
        rep=rep, c=rep.campaign, counts=rep.counts, rows=rep.rows, fmt_rate=_fmt_rate,
        gpus=[_gpu_cells(g) for g in rep.gpus], when=_when, esc=html.escape)


def render_markdown(rep: Report) -> str:
    """A short markdown summary (CI logs, job summaries)."""
    c = rep.campaign
    counts = ", ".join(f"{o} {n}" for o, n in rep.counts.items() if n)
    out = [f"## hazards {c.kind} campaign {c.id}" + (f" ({c.name})" if c.name else ""),
           "", f"{_when(c.created)} on {c.host}, status **{c.status}**; runs: {counts or 'none'}", ""]
    if rep.rows:
        out += ["| target/variant | expect | runs | clean | hang | fault | mismatch | error | failure rate "
                "| verdict |", "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in rep.rows:
            k = r.counts
            out.append(f"| {r.label} | {r.expect or '-'} | {r.n} | {k['clean']} | {k['hang']} | {k['fault']} "
                       f"| {k['mismatch']} | {k['error']} | {_fmt_rate(r)} | {r.judgement.verdict} |")
        out.append("")
    new = [s for s in rep.signatures if s["new"]]
    if rep.previous_id is not None:
        out.append(f"Compared with campaign {rep.previous_id}: {len(new)} new failure signature(s), "
                   f"{len(rep.changes)} significant rate change(s).")
        for s in new:
            out.append(f"- NEW {s['outcome']} in {s['target']}/{s['variant']}: {s['message']} (x{s['count']})")
        for ch in rep.changes:
            out.append(f"- {ch['target']}/{ch['variant']}: {ch['verdict']}")
        out.append("")
    if rep.hint:
        out += [f"**{rep.hint}**", ""]
    for note in rep.notes:
        out.append(f"- {note}")
    return "\n".join(out).rstrip() + "\n"


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
             "first_failure_s": r.first_failure_s, "kernel_ms_median": r.kernel_ms_median} for r in rep.rows]
    return {"campaign": {"id": c.id, "kind": c.kind, "name": c.name, "status": c.status,
                         "created": c.created, "host": c.host},
            "counts": rep.counts, "rows": rows, "gpus": [dataclasses.asdict(g) for g in rep.gpus],
            "signatures": rep.signatures, "previous_id": rep.previous_id, "changes": rep.changes,
            "hint": rep.hint, "notes": list(rep.notes)}


def junit_suites(rep: Report) -> list[JUnitSuite]:
    """The campaign as JUnit: one case per target/variant, judged by
    `hazards.engine.verdict.judge` (a canary fails as "went-blind", anything expected
    clean that failed as "failed", one with no judged run is an error)."""
    c = rep.campaign
    suite = JUnitSuite(f"hazards.{c.kind}", started_at=c.created, stdout=render_markdown(rep),
                       properties={"campaign": str(c.id), "host": c.host, "status": c.status})
    for r in rep.rows:
        name = r.label + (f" ({r.expect.noun})" if r.expect else "")
        suite.cases.append(r.judgement.junit_case(name, f"hazards.{c.kind}.{r.target}", r.busy_s))
    return [suite]


def write_report(store: Store, campaign_id: int, out: str | Path, *, last: int = 10) -> Report:
    """Build the report and write it as HTML to `out` (atomically); returns the data."""
    rep = build_report(store, campaign_id, last=last)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_html(rep), encoding="utf-8")
    tmp.replace(path)
    return rep
