"""The report's figures: matplotlib (Agg, no display) rendered to PNG bytes.

Each function takes plain data and returns PNG bytes, or None when there is nothing to
draw (a figure of no data would only mislead). The report embeds them as base64.
"""
from __future__ import annotations

import io
from datetime import datetime
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: never look for a display
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

OUTCOME_COLOURS = {"clean": "#4c9a2a", "hang": "#7b3294", "fault": "#d7191c",
                   "mismatch": "#fdae61", "error": "#8c8c8c"}
MAX_KEYS = 120  # figures grow with their rows; past this a figure says what it left out


def _shown(n_total: int) -> str:
    """Title suffix when a figure shows only the first MAX_KEYS of n_total rows."""
    return f" (first {MAX_KEYS} of {n_total})" if n_total > MAX_KEYS else ""


def _png(fig: "plt.Figure") -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def outcome_bars(labels: Sequence[str], counts: Sequence[dict[str, int]]) -> bytes | None:
    """Stacked horizontal bars: outcome counts per target/variant."""
    if not labels:
        return None
    n_total = len(labels)
    labels, counts = list(labels)[:MAX_KEYS], list(counts)[:MAX_KEYS]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(labels) + 1.2))
    left = [0] * len(labels)
    for outcome, colour in OUTCOME_COLOURS.items():
        vals = [c.get(outcome, 0) for c in counts]
        if any(vals):
            ax.barh(labels, vals, left=left, color=colour, label=outcome)
            left = [a + b for a, b in zip(left, vals)]
    ax.invert_yaxis()
    ax.set_xlabel("runs")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("Outcomes per target/variant" + _shown(n_total))
    return _png(fig)


def rate_intervals(labels: Sequence[str], rates: Sequence[float], cis: Sequence[tuple[float, float]]) -> bytes | None:
    """Failure rate with its confidence interval per target/variant (log-free, 0..1)."""
    pts = [(lab, r, ci) for lab, r, ci in zip(labels, rates, cis) if r is not None]
    n_total = len(pts)
    pts = pts[:MAX_KEYS]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(pts) + 1.2))
    ys = list(range(len(pts)))
    xs = [p[1] for p in pts]
    lo = [max(0.0, p[1] - p[2][0]) for p in pts]
    hi = [max(0.0, p[2][1] - p[1]) for p in pts]
    ax.errorbar(xs, ys, xerr=[lo, hi], fmt="o", color="#2c7bb6", ecolor="#555", capsize=3)
    ax.set_yticks(ys, [p[0] for p in pts])
    ax.invert_yaxis()
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel("failure rate (95% exact CI)")
    ax.set_title("Failure rate per target/variant" + _shown(n_total))
    return _png(fig)


def trends(series: dict[str, Sequence[Any]]) -> bytes | None:
    """Failure rate over time for each key: one point per campaign (`TrendPoint`s: when,
    failures, judged, ci()), x the date the campaign started, y the rate on a log scale with
    its exact 95% interval; a campaign with no failure is its one-sided upper bound (a
    downward triangle: the rate is somewhere below it)."""
    series = {k: v for k, v in series.items() if v}
    if not series or max(len(v) for v in series.values()) < 2:
        return None
    fig, ax = plt.subplots(figsize=(8, 3.8))
    floor = 1.0
    for i, (key, pts) in enumerate(list(series.items())[:10]):
        colour = f"C{i}"
        seen = [p for p in pts if p.failures]
        bounded = [p for p in pts if not p.failures]
        if seen:
            xs = [datetime.fromtimestamp(p.when) for p in seen]
            ys = [p.rate for p in seen]
            lo = [p.rate - p.ci()[0] for p in seen]
            hi = [p.ci()[1] - p.rate for p in seen]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=2, color=colour, label=key)
            floor = min(floor, *(p.ci()[0] for p in seen))
        if bounded:
            ax.plot([datetime.fromtimestamp(p.when) for p in bounded], [p.ci()[1] for p in bounded],
                    linestyle="none", marker="v", markerfacecolor="none", color=colour,
                    label=None if seen else f"{key} (no failure: upper bound)")
            floor = min(floor, *(p.ci()[1] for p in bounded))
    ax.set_yscale("log")
    ax.set_ylim(max(floor / 3, 1e-7), 1.5)
    ax.set_ylabel("failure rate (log, 95% exact CI)")
    ax.xaxis.set_major_locator(mdates.AutoDateLocator())
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
    ax.set_xlabel("campaign start")
    ax.legend(fontsize=7, loc="best")
    shown = f" ({min(10, len(series))} of {len(series)} keys)" if len(series) > 10 else ""
    ax.set_title("Failure rate over time (open triangle: no failure, the rate is below it)" + shown)
    return _png(fig)


def distributions(samples: dict[str, list[float]], *, title: str, xlabel: str, log: bool = False) -> bytes | None:
    """Box plots of one quantity per key (time to failure, kernel time)."""
    samples = {k: v for k, v in samples.items() if v}
    if not samples:
        return None
    keys = list(samples)[:MAX_KEYS]
    title += _shown(len(samples))
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(keys) + 1.4))
    data = [samples[k] for k in keys]
    try:
        ax.boxplot(data, orientation="horizontal", showfliers=True)  # matplotlib >= 3.10
    except TypeError:
        ax.boxplot(data, vert=False, showfliers=True)
    ax.set_yticks(range(1, len(keys) + 1), keys)
    ax.invert_yaxis()
    if log and all(x > 0 for k in keys for x in samples[k]):
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return _png(fig)
