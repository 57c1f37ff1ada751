"""The report's figures: matplotlib (Agg, no display) rendered to PNG bytes.

Each function takes plain data and returns PNG bytes, or None when there is nothing to
draw (a figure of no data would only mislead). The report embeds them as base64.
"""
from __future__ import annotations

import io
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: never look for a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

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


def trends(series: dict[str, list[tuple[int, float, float, float]]]) -> bytes | None:
    """Failure rate per campaign (x: campaign id) for each key: (id, rate, lo, hi) points."""
    series = {k: v for k, v in series.items() if v}
    if not series or max(len(v) for v in series.values()) < 2:
        return None
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for key, pts in list(series.items())[:10]:
        xs = [p[0] for p in pts]
        ax.errorbar(xs, [p[1] for p in pts], yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                    marker="o", capsize=2, label=key)
    ax.set_xlabel("campaign")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("failure rate")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, loc="best")
    shown = f" ({min(10, len(series))} of {len(series)} keys)" if len(series) > 10 else ""
    ax.set_title("Failure rate over recent campaigns" + shown)
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
