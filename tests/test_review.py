"""study/review.py's statistics by hand: Student's t, the paired and Welch intervals, Holm's adjustment over a family
with comparisons not yet run, the verdict, the bootstrap on draws that can be counted, and the simulated false-positive
rates of both procedures."""
import math

import numpy as np
import pytest

import review


def test_students_t_by_hand():
    # df = 1 is Cauchy's: P(|T| > 1) = 1/2; df = 2 has p = 1 - t / sqrt(t^2 + 2) in closed form
    assert review.t_p(1.0, 1) == pytest.approx(0.5, abs=1e-12)
    assert review.t_p(2.0, 2) == pytest.approx(1 - 2 / math.sqrt(6), abs=1e-12)
    # the tables' 97.5% quantiles: 12.706 (df 1), 2.776 (4), 2.262 (9)
    for df, t in ((1, 12.7062), (4, 2.7764), (9, 2.2622)):
        assert review.t_quantile(0.975, df) == pytest.approx(t, abs=1e-4)


def test_the_paired_t_interval_by_hand():
    # differences 0.01, 0.03, 0.02, 0.05, 0.00: mean 0.022, sd 0.019235, se 0.0086023; t(0.975, 4) = 2.776445
    mean, low, high, p, n = review.paired_t(np.array([0.01, 0.03, 0.02, 0.05, 0.00]))
    half = 2.776445 * 0.0086023
    assert (mean, n) == (pytest.approx(0.022), 5)
    assert (low, high) == (pytest.approx(0.022 - half, abs=1e-6), pytest.approx(0.022 + half, abs=1e-6))
    assert p == pytest.approx(review.t_p(0.022 / 0.0086023, 4), abs=1e-6) and 0.05 < p < 0.1   # t 2.557
    assert review.paired_t(np.array([0.1]))[1:4] == (None, None, None)                     # one seed: no interval


def test_welch_by_hand():
    # a = 1..4 (mean 2.5, var/n 0.41667), b = 2 3 5 6 9 (mean 5, var/n 1.5): se 1.38444, t -1.80578, and
    # Satterthwaite's df 1.91667^2 / (0.41667^2 / 3 + 1.5^2 / 4) = 5.9216
    mean, low, high, p, _ = review.welch_t(np.array([1.0, 2, 3, 4]), np.array([2.0, 3, 5, 6, 9]))
    half = review.t_quantile(0.975, 5.9216) * 1.38444
    assert mean == -2.5 and low == pytest.approx(-2.5 - half, abs=1e-3) and high == pytest.approx(-2.5 + half, abs=1e-3)
    assert p == pytest.approx(review.t_p(1.80578, 5.9216), abs=1e-4)


def test_holm_by_hand_counts_the_comparisons_not_run():
    # m = 4, one not run (counted at p = 1, last): 0.01 x 4 = 0.04; 0.03 x 3 = 0.09; 0.04 x 2 = 0.08, raised to 0.09
    assert review.holm([0.01, 0.04, None, 0.03]) == pytest.approx([0.04, 0.09, None, 0.09])
    assert review.holm([0.5, 0.6]) == [1.0, 1.0]                                 # capped at 1
    assert review.holm([None]) == [None]


def test_a_difference_holds_only_where_its_adjusted_p_is_small():
    assert review.verdict((0.03, 0.01, 0.05, 0.001, 5), 0.04) == "holds"
    assert review.verdict((0.03, 0.01, 0.05, 0.001, 5), 0.2) == "unadjusted only"
    assert review.verdict((0.03, -0.01, 0.07, 0.2, 5), 1.0) == "not separated"
    assert review.verdict((0.03, None, None, None, 1), None) == "pending: one seed"


def test_the_bootstrap_of_one_seed_and_two_questions():
    # One seed, questions differing by 0 and 1: a draw resamples the two questions, so its mean is 0, 1/2 or 1 with
    # probabilities 1/4, 1/2, 1/4. The 95% interval is then [0, 1], and p = 2 min(P(<= 0), P(>= 0)) = 1/2.
    mean, low, high, p = review.bootstrap(np.array([[0.0, 1.0]]))
    assert (mean, low, high) == (0.5, 0.0, 1.0)
    assert p == pytest.approx(0.5, abs=0.03)                   # 10,000 draws: a standard error of 0.009
    # a difference the same on every seed and question: every draw is it, and p is the floor 2 / draws
    assert review.bootstrap(np.full((5, 7), 0.25)) == pytest.approx((0.25, 0.25, 0.25, 2 / review.DRAWS))
    # seeds resampled too: with one question, seeds differing by -1 and +1 give draws -1, 0, 1 (1/4, 1/2, 1/4)
    mean, low, high, p = review.bootstrap(np.array([[-1.0], [1.0]]))
    assert (mean, low, high) == (0.0, -1.0, 1.0) and p == 1.0


def test_the_simulated_false_positive_rates():
    """Where the seeds carry the variance, the paired t keeps its 5% and the bootstrap over seeds x questions at five
    seeds does not (too narrow: 0.15 here); where the questions carry it, the bootstrap counts their noise twice (in
    the seeds' means and again by resampling them) and rejects almost nothing, the t still 5%."""
    t_rate, boot_rate = review.simulated_fpr(0.03 ** 2, np.full(200, 0.05 ** 2), seeds=5, sims=1000)
    assert 0.03 < t_rate < 0.07 and boot_rate > 0.1                   # 1,000 sims: a standard error of 0.007
    t_rate, boot_rate = review.simulated_fpr(0.0, np.full(200, 0.1 ** 2), seeds=10, sims=1000)
    assert 0.03 < t_rate < 0.07 and boot_rate < 0.02
