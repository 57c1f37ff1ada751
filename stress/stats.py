"""Failure rates you can act on: intervals, bounds, before/after tests, SPRT.

A failure rate from stress runs is a binomial proportion. This module turns counts into
the numbers a GPU engineer needs: a rate with an exact (Clopper-Pearson) or Wilson
interval, an upper bound when nothing failed, whether a change made the rate drop
(one-sided Fisher and Boschloo), how many clean runs it takes to claim a rate below a
bound, and Wald's sequential probability ratio test to stop a campaign as soon as the
verdict is clear. More in docs/campaigns.md.
"""
from __future__ import annotations

import dataclasses
import math
import functools
from typing import Any, Literal

CiMethod = Literal["exact", "wilson"]


@functools.cache
def _scipy_stats() -> Any:
    """scipy.stats, imported on first use: it costs ~1 s, and most CLI calls never need it."""
    from scipy import stats

    return stats


@functools.cache
def _scipy_special() -> Any:
    """scipy.special (~0.2 s to import, a third of scipy.stats): the beta and normal
    quantiles every rate interval needs, so `hazards run` and `stats` never load scipy.stats."""
    from scipy import special

    return special


def _check_counts(k: int, n: int) -> None:
    if not (isinstance(k, int) and isinstance(n, int)) or n < 0 or k < 0 or k > n:
        raise ValueError(f"need integers 0 <= k <= n, got k={k!r} n={n!r}")


def _check_conf(conf: float) -> None:
    if not 0.0 < conf < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {conf!r}")


def rate_ci(k: int, n: int, conf: float = 0.95, method: CiMethod = "exact") -> tuple[float, float]:
    """Two-sided confidence interval for a rate of k failures in n runs.

    `exact` is Clopper-Pearson (never under-covers; the default for small counts),
    `wilson` the Wilson score interval (tighter, approximately calibrated). With n == 0
    nothing is known: (0, 1).
    """
    _check_counts(k, n)
    _check_conf(conf)
    if method not in ("exact", "wilson"):
        raise ValueError(f"method must be 'exact' or 'wilson', got {method!r}")
    if n == 0:
        return (0.0, 1.0)
    special = _scipy_special()
    if method == "exact":  # Clopper-Pearson: beta quantiles (what scipy.stats.binomtest inverts)
        tail = (1.0 - conf) / 2.0
        low = 0.0 if k == 0 else float(special.betaincinv(k, n - k + 1, tail))
        high = 1.0 if k == n else float(special.betaincinv(k + 1, n - k, 1.0 - tail))
        return (low, high)
    z = float(special.ndtri(0.5 + conf / 2.0))  # Wilson score interval
    p = k / n
    centre, half = (p + z * z / (2 * n)), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if k == 0 else (centre - half) / (1 + z * z / n)
    high = 1.0 if k == n else (centre + half) / (1 + z * z / n)
    return (low, high)


def upper_bound(k: int, n: int, conf: float = 0.95) -> float:
    """One-sided exact (Clopper-Pearson) upper bound on the rate: P(rate <= bound) >= conf."""
    _check_counts(k, n)
    _check_conf(conf)
    if n == 0 or k == n:
        return 1.0
    if k == 0:  # the same number in closed form (no scipy import: work sources ask this per run)
        return zero_failure_upper(n, conf)
    return float(_scipy_special().betaincinv(k + 1, n - k, conf))  # the beta quantile


def zero_failure_upper(n: int, conf: float = 0.95) -> float:
    """Upper bound on the rate after n runs without a failure: 1 - (1 - conf)**(1/n).

    (The exact one-sided bound for k = 0; for large n it approaches the "rule of three",
    3/n at 95 %.)
    """
    _check_counts(0, n)
    _check_conf(conf)
    if n == 0:
        return 1.0
    return 1.0 - (1.0 - conf) ** (1.0 / n)


def runs_needed(rate_bound: float, conf: float = 0.95, failures: int = 0) -> int:
    """Smallest number of runs that bounds the rate below `rate_bound` at `conf`.

    With failures == 0 (the usual question: "how many clean runs until I may claim
    < 1 %?") this is ceil(log(1 - conf) / log(1 - rate_bound)): 299 for 1 % at 95 %.
    With failures > 0 it is the smallest n whose exact one-sided upper bound for
    `failures`/n is below `rate_bound`.
    """
    if not 0.0 < rate_bound < 1.0:
        raise ValueError(f"rate bound must be in (0, 1), got {rate_bound!r}")
    _check_conf(conf)
    if failures < 0:
        raise ValueError(f"failures must be >= 0, got {failures!r}")
    if failures == 0:
        n = math.ceil(math.log(1.0 - conf) / math.log(1.0 - rate_bound))
        # guard the float edge: make sure n really bounds it and n-1 does not
        while n > 1 and zero_failure_upper(n - 1, conf) < rate_bound:
            n -= 1
        while zero_failure_upper(n, conf) >= rate_bound:
            n += 1
        return n
    lo, hi = failures + 1, failures + 1
    while upper_bound(failures, hi, conf) >= rate_bound:
        lo, hi = hi, hi * 2
    while lo < hi:  # smallest n in (lo, hi] with bound < rate_bound; the bound falls with n
        mid = (lo + hi) // 2
        if upper_bound(failures, mid, conf) < rate_bound:
            hi = mid
        else:
            lo = mid + 1
    return hi


def _table(k_before: int, n_before: int, k_after: int, n_after: int) -> list[list[int]]:
    _check_counts(k_before, n_before)
    _check_counts(k_after, n_after)
    return [[k_before, n_before - k_before], [k_after, n_after - k_after]]


def fisher_one_sided(k_before: int, n_before: int, k_after: int, n_after: int) -> float:
    """One-sided Fisher exact p-value for "the failure rate dropped from before to after".

    4/7 vs 0/10 gives p = C(7,4) / C(17,4) = 35/2380 = 0.0147.
    """
    table = _table(k_before, n_before, k_after, n_after)
    if n_before == 0 or n_after == 0:
        return 1.0
    return float(_scipy_stats().fisher_exact(table, alternative="greater").pvalue)


def boschloo(k_before: int, n_before: int, k_after: int, n_after: int, n_points: int = 32) -> float:
    """One-sided Boschloo exact p-value for "the failure rate dropped" (never above Fisher's).

    Boschloo's test is uniformly more powerful than Fisher's for the 2x2 table; scipy
    maximises over the nuisance parameter on `n_points` grid points.
    """
    table = _table(k_before, n_before, k_after, n_after)
    if n_before == 0 or n_after == 0:
        return 1.0
    # scipy returns nan when a column is all zero (nothing failed, or everything did):
    # then the data carry no evidence of a drop.
    p = float(_scipy_stats().boschloo_exact(table, alternative="greater", n=n_points).pvalue)
    return 1.0 if math.isnan(p) else min(p, 1.0)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: reject hypothesis i at
    level alpha when its adjusted p is below alpha. Controls the family-wise error rate
    (the chance of any false rejection) at alpha, whatever the dependence between tests.
    scipy has Benjamini-Hochberg (`false_discovery_control`) but not Holm."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [1.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


@dataclasses.dataclass
class Comparison:
    """A before/after comparison of two failure counts, with the verdict in words."""

    k_before: int
    n_before: int
    k_after: int
    n_after: int
    conf: float
    rate_bound: float
    fisher_p_one_sided: float
    boschloo_p: float
    fisher_p_rose: float
    before_rate: float
    after_rate: float
    before_ci: tuple[float, float]
    after_ci: tuple[float, float]
    after_upper: float
    runs_needed: int
    dropped: bool
    rose: bool
    evidence_of_fix: bool
    verdict: str

    def to_json(self) -> dict:
        """A JSON-ready dict; the 95 %/1 % keys are named for the default conf and bound."""
        d = dataclasses.asdict(self)
        d["before_ci"] = list(self.before_ci)
        d["after_ci"] = list(self.after_ci)
        d[f"after_upper_{_pct_label(self.conf)}"] = self.after_upper
        d[f"runs_needed_{_pct_label(self.rate_bound)}pct"] = self.runs_needed
        return d


def _pct_label(x: float) -> str:
    return f"{x * 100:g}".replace(".", "_")


def percent(x: float) -> str:
    """A rate in words: 25.9 % -> '26%', 0.4 % -> '0.4%'."""
    v = x * 100
    if v >= 10 or v == 0:
        return f"{v:.0f}%"
    if v >= 1:
        return f"{v:.1f}%".replace(".0%", "%")
    return f"{v:.2g}%"


def compare(
    k_before: int,
    n_before: int,
    k_after: int,
    n_after: int,
    conf: float = 0.95,
    rate_bound: float = 0.01,
    alpha: float | None = None,
) -> Comparison:
    """Compare failure counts before and after a change; say in words what they show.

    "Dropped" means the one-sided Fisher p is below alpha (default 1 - conf). A fix is
    claimed only when the after-rate's one-sided upper bound at `conf` is below
    `rate_bound` (and it did not rise); otherwise the verdict says how many runs would
    bound it.
    """
    alpha = 1.0 - conf if alpha is None else alpha
    p_drop = fisher_one_sided(k_before, n_before, k_after, n_after)
    p_rose = fisher_one_sided(k_after, n_after, k_before, n_before)
    p_bosch = boschloo(k_before, n_before, k_after, n_after)
    after_upper = upper_bound(k_after, n_after, conf)
    need = runs_needed(rate_bound, conf, failures=k_after)
    dropped = p_drop < alpha
    rose = p_rose < alpha
    fixed = after_upper < rate_bound and not rose
    bound_s = percent(rate_bound)

    if dropped:
        head = f"rate dropped (p={p_drop:.2g})"
    elif rose:
        head = f"rate rose (p={p_rose:.2g})"
    else:
        head = f"no significant change (p={p_drop:.2g} for a drop)"
    bound = f"after-rate {format_rate(k_after, n_after, conf)}"
    if fixed:
        tail = f"evidence of a fix: the after-rate is below {bound_s}"
    elif k_after == 0:
        more = need - n_after
        tail = (f"not yet evidence of a fix, {need} clean runs bound it below {bound_s}"
                f" ({more} more)")
    else:
        tail = (f"not a fix: {k_after} failure{'s' if k_after != 1 else ''} after the change"
                f" ({need} runs with no more failures would bound it below {bound_s})")
    return Comparison(
        k_before=k_before, n_before=n_before, k_after=k_after, n_after=n_after,
        conf=conf, rate_bound=rate_bound,
        fisher_p_one_sided=p_drop, boschloo_p=p_bosch, fisher_p_rose=p_rose,
        before_rate=k_before / n_before if n_before else float("nan"),
        after_rate=k_after / n_after if n_after else float("nan"),
        before_ci=rate_ci(k_before, n_before, conf), after_ci=rate_ci(k_after, n_after, conf),
        after_upper=after_upper, runs_needed=need,
        dropped=dropped, rose=rose, evidence_of_fix=fixed,
        verdict=f"{head}; {bound}: {tail}",
    )


class Sprt:
    """Wald's sequential probability ratio test on a failure rate.

    H0: rate = p0, H1: rate = p1 (p0 < p1). Feed one run at a time with `update(failed)`;
    `decision` becomes "accept_h0" or "accept_h1" once the log-likelihood ratio leaves
    (log(beta/(1-alpha)), log((1-beta)/alpha)), and stays None until then. Error rates:
    alpha = P(accept H1 | H0), beta = P(accept H0 | H1).

    Canary use: p0 = "the broken variant is (almost) never detected", p1 = its expected
    detection rate; accept_h1 = the check still sees it, accept_h0 = the check went blind.
    Clean use: p0 = the acceptable rate, p1 = a rate that would matter.
    """

    def __init__(self, p0: float, p1: float, alpha: float = 0.05, beta: float = 0.05) -> None:
        if not 0.0 < p0 < p1 < 1.0:
            raise ValueError(f"need 0 < p0 < p1 < 1, got p0={p0!r} p1={p1!r}")
        if not (0.0 < alpha < 0.5 and 0.0 < beta < 0.5):
            raise ValueError(f"alpha and beta must be in (0, 0.5), got {alpha!r}, {beta!r}")
        self.p0, self.p1, self.alpha, self.beta = p0, p1, alpha, beta
        self.upper = math.log((1.0 - beta) / alpha)
        self.lower = math.log(beta / (1.0 - alpha))
        self._llr_fail = math.log(p1 / p0)
        self._llr_pass = math.log((1.0 - p1) / (1.0 - p0))
        self.llr = 0.0
        self.n = 0
        self.k = 0
        self.decision: str | None = None

    def update(self, failed: bool) -> str | None:
        """Add one run; return the decision (None while undecided). Frozen once decided."""
        if self.decision is not None:
            return self.decision
        self.n += 1
        self.k += int(bool(failed))
        self.llr += self._llr_fail if failed else self._llr_pass
        if self.llr >= self.upper:
            self.decision = "accept_h1"
        elif self.llr <= self.lower:
            self.decision = "accept_h0"
        return self.decision

    def clean_runs_to_accept_h0(self) -> int:
        """How many consecutive clean runs from here would accept H0."""
        if self.decision is not None:
            return 0
        return max(0, math.ceil((self.lower - self.llr) / self._llr_pass))


def format_rate(k: int, n: int, conf: float = 0.95) -> str:
    """The one way every command, report and test summary writes a rate.

    '57% (95% CI 18%–90%)' for 4 of 7 (exact interval); with no failure the exact one-sided
    bound, '≤ 26% (95% upper bound)' for 0 of 10; 'n/a (no judged runs)' for none.
    """
    _check_counts(k, n)
    if n == 0:
        return "n/a (no judged runs)"
    if k == 0:
        return f"≤ {percent(upper_bound(0, n, conf))} ({percent(conf)} upper bound)"
    lo, hi = rate_ci(k, n, conf)
    return f"{percent(k / n)} ({percent(conf)} CI {percent(lo)}–{percent(hi)})"


def describe_rate(k: int, n: int, conf: float = 0.95, what: str = "failure") -> str:
    """A rate in words, e.g. '4 failures in 7 runs: rate 57% (95% CI 18%–90%)' (`format_rate`)."""
    _check_counts(k, n)
    if n == 0:
        return f"no judged runs: nothing known about the {what} rate"
    head = f"{k} {what}{'s' if k != 1 else ''} in {n} run{'s' if n != 1 else ''}"
    return f"{head}: rate {format_rate(k, n, conf)}"


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided interval; `achieved` is the interval's exact
    coverage (>= the requested level; 0.0 with infinite bounds when too few data)."""

    estimate: float
    lo: float
    hi: float
    achieved: float
    n: int

    @property
    def resolved(self) -> bool:
        """Both bounds are finite (enough data for an interval at the requested level)."""
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    def to_json(self) -> dict[str, Any]:
        return {"estimate": self.estimate, "lo": self.lo if self.resolved else None,
                "hi": self.hi if self.resolved else None, "achieved": self.achieved, "n": self.n}


@functools.lru_cache(maxsize=256)
def _signed_rank_cdf(n: int) -> tuple[float, ...]:
    """P(W+ <= w) for w = 0..n(n+1)/2 under H0 (exact: subsets of ranks 1..n by sum)."""
    top = n * (n + 1) // 2
    counts = [1] + [0] * top
    for r in range(1, n + 1):
        for w in range(top, r - 1, -1):
            counts[w] += counts[w - r]
    total = float(2 ** n)
    out, acc = [], 0
    for c in counts:
        acc += c
        out.append(acc / total)
    return tuple(out)


def min_pairs(conf: float) -> int:
    """The fewest pairs for which an exact two-sided signed-rank interval at `conf` exists
    (its most extreme bound has probability 2 * 2**-n)."""
    _check_conf(conf)
    n = 1
    while 2.0 * 2.0 ** -n > 1.0 - conf:
        n += 1
    return n


def shift_ci(diffs: list[float] | tuple[float, ...], conf: float = 0.95) -> Interval:
    """Hodges-Lehmann estimate of the center of paired differences, with the exact
    Wilcoxon signed-rank interval (the Walsh averages' order statistics).

    Distribution-free for a symmetric difference distribution; on log ratios it gives the
    ratio of a candidate to a baseline as exp(estimate) with exp(lo), exp(hi). With too
    few pairs for `conf` (see `min_pairs`) the bounds are infinite: not resolved.
    """
    _check_conf(conf)
    d = [float(x) for x in diffs]
    if not d or not all(math.isfinite(x) for x in d):
        raise ValueError("need at least one finite difference")
    n = len(d)
    walsh = sorted((d[i] + d[j]) / 2.0 for i in range(n) for j in range(i, n))
    m = len(walsh)
    mid = m // 2
    est = walsh[mid] if m % 2 else (walsh[mid - 1] + walsh[mid]) / 2.0
    alpha = 1.0 - conf
    cdf = _signed_rank_cdf(n) if n <= 60 else None
    if cdf is not None:
        c = 0  # the largest c >= 1 with P(W+ <= c - 1) <= alpha / 2
        while c < m // 2 and cdf[c] <= alpha / 2.0:
            c += 1
        achieved = 1.0 - 2.0 * cdf[c - 1] if c >= 1 else 0.0
    else:  # normal approximation of W+ for many pairs
        z = _scipy_stats().norm.ppf(1.0 - alpha / 2.0)
        mean, sd = m / 2.0, math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
        c = max(0, int(math.floor(mean - z * sd)))
        achieved = conf if c >= 1 else 0.0
    if c < 1:
        return Interval(est, -math.inf, math.inf, 0.0, n)
    return Interval(est, walsh[c - 1], walsh[m - c], achieved, n)


def median_ci(values: list[float] | tuple[float, ...], conf: float = 0.95) -> Interval:
    """The sample median with the exact order-statistic (sign-test) interval of the
    population median: distribution-free, no symmetry assumed."""
    _check_conf(conf)
    x = sorted(float(v) for v in values)
    if not x or not all(math.isfinite(v) for v in x):
        raise ValueError("need at least one finite value")
    n = len(x)
    mid = n // 2
    est = x[mid] if n % 2 else (x[mid - 1] + x[mid]) / 2.0
    binom = _scipy_stats().binom
    half = (1.0 - conf) / 2.0
    j = int(binom.ppf(half, n, 0.5))  # smallest k with P(B <= k) >= half
    if binom.cdf(j, n, 0.5) <= half:
        j += 1
    # j = the largest count with P(B <= j - 1) <= half: interval [x_(j), x_(n + 1 - j)]
    if j < 1:
        return Interval(est, -math.inf, math.inf, 0.0, n)
    achieved = 1.0 - 2.0 * float(binom.cdf(j - 1, n, 0.5))
    return Interval(est, x[j - 1], x[n - j], achieved, n)
