"""Rank-based intervals for the gates: the Hodges-Lehmann shift with its exact signed-rank
interval, and the sign-test interval of a median. Exact coverage, checked by simulation."""
import math
import random

import pytest

from hazards.engine.stats import median_ci, min_pairs, shift_ci


def test_the_exact_signed_rank_interval_has_the_textbook_coverage():
    # n = 10 at 95%: the critical value is P(W+ <= 8) = 25/1024, coverage 1 - 50/1024
    iv = shift_ci([0.1 * i for i in range(10)], 0.95)
    assert iv.achieved == pytest.approx(1 - 50 / 1024)
    assert iv.resolved and iv.lo < iv.estimate < iv.hi
    assert iv.estimate == pytest.approx(0.45)


def test_min_pairs_is_the_first_count_with_a_finite_interval():
    assert (min_pairs(0.95), min_pairs(0.99), min_pairs(0.995)) == (6, 8, 9)
    assert not shift_ci([0.1] * 5, 0.95).resolved
    assert shift_ci([0.1, 0.2, 0.3, 0.1, 0.2, 0.3], 0.95).resolved


def test_shift_interval_covers_the_true_shift_at_its_level():
    rng = random.Random(3)
    hits = 0
    trials = 1500
    for _ in range(trials):
        d = [0.05 + rng.gauss(0, 0.02) for _ in range(10)]
        iv = shift_ci(d, 0.95)
        hits += iv.lo <= 0.05 <= iv.hi
    assert hits / trials >= 0.93  # exact level 0.951; binomial noise ~0.006


def test_median_interval_covers_the_median_of_a_skewed_distribution():
    rng = random.Random(5)
    true_median = math.log(2)  # of Exp(1)
    hits = 0
    trials = 1500
    for _ in range(trials):
        iv = median_ci([rng.expovariate(1.0) for _ in range(51)], 0.95)
        assert iv.achieved >= 0.95
        hits += iv.lo <= true_median <= iv.hi
    assert hits / trials >= 0.94


def test_bad_input_is_a_value_error():
    with pytest.raises(ValueError):
        shift_ci([], 0.95)
    with pytest.raises(ValueError):
        median_ci([float("nan")], 0.95)
    with pytest.raises(ValueError):
        shift_ci([1.0], 1.5)
