"""Statistics: the design's worked example and the textbook properties behind it."""
from __future__ import annotations

import math
import random

import pytest
from scipy import stats as st

from hazards.engine.stats import (Sprt, boschloo, compare, describe_rate, fisher_one_sided, rate_ci,
                          runs_needed, upper_bound, zero_failure_upper)


def test_fisher_one_sided_4_of_7_vs_0_of_10_is_0_0147():
    # hypergeometric tail: all 4 failures land in the 7 "before" runs: C(7,4)/C(17,4)
    p = fisher_one_sided(4, 7, 0, 10)
    assert p == pytest.approx(35 / 2380, rel=1e-12)
    assert round(p, 4) == 0.0147


def test_after_rate_upper_bound_for_0_of_10_is_0_259():
    expected = 1 - 0.05 ** (1 / 10)
    assert zero_failure_upper(10) == pytest.approx(expected, rel=1e-12)
    assert upper_bound(0, 10) == pytest.approx(expected, rel=1e-9)
    assert round(expected, 3) == 0.259


def test_299_clean_runs_needed_to_claim_below_1pct_at_95():
    assert runs_needed(0.01, 0.95) == 299
    assert zero_failure_upper(299) < 0.01 <= zero_failure_upper(298)


@pytest.mark.parametrize("bound,conf", [(0.01, 0.95), (0.05, 0.95), (0.001, 0.99), (0.1, 0.9)])
def test_runs_needed_is_the_smallest_sufficient_n(bound, conf):
    n = runs_needed(bound, conf)
    assert zero_failure_upper(n, conf) < bound <= zero_failure_upper(n - 1, conf)


@pytest.mark.parametrize("failures", [1, 2, 5])
def test_runs_needed_with_failures_is_the_smallest_sufficient_n(failures):
    n = runs_needed(0.01, 0.95, failures=failures)
    assert upper_bound(failures, n) < 0.01 <= upper_bound(failures, n - 1)


def test_compare_reproduces_the_design_verdict():
    c = compare(4, 7, 0, 10)
    assert c.fisher_p_one_sided == pytest.approx(0.0147, abs=5e-5)
    assert c.after_upper == pytest.approx(0.2589, abs=5e-4)
    assert c.runs_needed == 299
    assert c.dropped and not c.evidence_of_fix
    assert c.verdict.startswith("rate dropped (p=0.015); after-rate ≤ 26% (95% upper bound): "
                                "not yet evidence of a fix, 299 clean runs bound it below 1%")
    j = c.to_json()
    assert j["fisher_p_one_sided"] == c.fisher_p_one_sided
    assert j["after_upper_95"] == c.after_upper
    assert j["runs_needed_1pct"] == 299
    assert j["boschloo_p"] == c.boschloo_p


def test_compare_claims_a_fix_only_when_the_after_bound_is_below_the_target():
    assert compare(4, 7, 0, 299).evidence_of_fix
    assert not compare(4, 7, 0, 298).evidence_of_fix
    assert "evidence of a fix" in compare(4, 7, 0, 400).verdict
    assert "not a fix" in compare(4, 7, 1, 10).verdict


def test_compare_says_when_the_rate_rose():
    c = compare(0, 10, 5, 10)
    assert c.rose and not c.dropped and c.verdict.startswith("rate rose")


def test_compare_without_a_difference_is_not_a_drop():
    c = compare(1, 10, 1, 10)
    assert not c.dropped and not c.rose
    assert c.verdict.startswith("no significant change")


def test_boschloo_is_valid_and_at_least_as_powerful_as_fisher():
    pb = boschloo(4, 7, 0, 10)
    assert 0 < pb <= fisher_one_sided(4, 7, 0, 10)
    assert pb == pytest.approx(st.boschloo_exact([[4, 3], [0, 10]], alternative="greater").pvalue, rel=1e-6)
    # no failures anywhere: no evidence of a drop
    assert boschloo(0, 10, 0, 10) == 1.0


def test_exact_interval_matches_clopper_pearson_beta_quantiles():
    lo, hi = rate_ci(4, 7, 0.95, "exact")
    assert lo == pytest.approx(st.beta.ppf(0.025, 4, 4), rel=1e-9)
    assert hi == pytest.approx(st.beta.ppf(0.975, 5, 3), rel=1e-9)


def test_wilson_interval_matches_its_formula():
    k, n, z = 4, 7, st.norm.ppf(0.975)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo, hi = rate_ci(k, n, method="wilson")
    assert lo == pytest.approx(centre - half, rel=1e-9)
    assert hi == pytest.approx(centre + half, rel=1e-9)


def test_exact_interval_covers_at_least_nominal_level():
    # Clopper-Pearson never under-covers: check the exact coverage at a few true rates.
    n = 30
    for p in (0.02, 0.1, 0.37):
        cover = sum(st.binom.pmf(k, n, p) for k in range(n + 1)
                    if rate_ci(k, n)[0] <= p <= rate_ci(k, n)[1])
        assert cover >= 0.95 - 1e-12


def test_intervals_reject_impossible_counts():
    for k, n in [(-1, 5), (6, 5), (1, -1)]:
        with pytest.raises(ValueError):
            rate_ci(k, n)
    assert rate_ci(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        rate_ci(1, 5, conf=1.5)


def test_describe_rate_in_words():
    assert describe_rate(4, 7) == "4 failures in 7 runs: rate 57% (95% CI 18%–90%)"
    assert describe_rate(0, 10) == "0 failures in 10 runs: rate ≤ 26% (95% upper bound)"


def test_sprt_accepts_h1_for_a_variant_that_keeps_failing():
    s = Sprt(p0=0.01, p1=0.3)
    decisions = [s.update(True) for _ in range(10)]
    assert s.decision == "accept_h1"
    # log(0.95/0.05) / log(30) = 0.87: a single failure already decides
    assert decisions[0] == "accept_h1"


def test_sprt_accepts_h0_after_the_predicted_number_of_clean_runs():
    s = Sprt(p0=0.01, p1=0.2)
    needed = s.clean_runs_to_accept_h0()
    expected = math.ceil(math.log(0.05 / 0.95) / math.log(0.8 / 0.99))
    assert needed == expected
    for i in range(needed - 1):
        assert s.update(False) is None
    assert s.update(False) == "accept_h0"
    assert s.update(True) == "accept_h0"  # frozen once decided


def test_sprt_error_rates_are_near_nominal_by_simulation():
    rng = random.Random(1234)

    def run(p: float) -> str:
        s = Sprt(p0=0.05, p1=0.3, alpha=0.05, beta=0.05)
        while s.decision is None:
            s.update(rng.random() < p)
        return s.decision

    trials = 2000
    false_h1 = sum(run(0.05) == "accept_h1" for _ in range(trials)) / trials
    false_h0 = sum(run(0.3) == "accept_h0" for _ in range(trials)) / trials
    # Wald's bounds: alpha/(1-beta) ~ 0.053 and beta/(1-alpha) ~ 0.053, allow sampling noise
    assert false_h1 < 0.075
    assert false_h0 < 0.075


def test_sprt_rejects_bad_hypotheses():
    with pytest.raises(ValueError):
        Sprt(p0=0.3, p1=0.1)


@pytest.mark.parametrize("method", ["exact", "wilson"])
def test_rate_ci_equals_scipys_binomial_proportion_interval(method):
    cases = [(k, n) for n in [*range(1, 40), 100, 299, 5000] for k in {0, 1, n // 3, n - 1, n}]
    for k, n in cases:
        for conf in (0.8, 0.95, 0.99):
            ref = st.binomtest(k, n).proportion_ci(confidence_level=conf, method=method)
            assert rate_ci(k, n, conf, method) == pytest.approx((ref.low, ref.high), abs=1e-9), (k, n, conf)
            if 0 < k < n:
                assert upper_bound(k, n, conf) == pytest.approx(st.beta.ppf(conf, k + 1, n - k), abs=1e-12)


def test_a_rate_in_words_never_imports_scipy_stats():
    """`hazards run`, `stats` and every summary describe rates; scipy.stats alone costs
    ~0.6 s of CPU per command (scipy.special, which the intervals need, a third of it)."""
    import subprocess
    import sys

    code = ("import sys; from hazards.engine.stats import describe_rate, rate_ci, upper_bound; "
            "describe_rate(3, 10); rate_ci(2, 9, method='wilson'); upper_bound(4, 50); "
            "print('scipy.stats' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
