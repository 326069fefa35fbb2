"""study/review.py's statistics by hand: Holm's adjustment, the verdict a difference gets, and the paired bootstrap on
a difference whose draws can be counted."""
import numpy as np
import pytest

import review


def test_holm_by_hand():
    # m = 3 comparisons (None: a row with nothing to compare): 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04,
    # raised to 0.06 as the adjustment never falls in the order of the raw p-values
    assert review.holm([0.01, 0.04, None, 0.03]) == pytest.approx([0.03, 0.06, None, 0.06])
    assert review.holm([0.5, 0.6]) == [1.0, 1.0]                                 # capped at 1
    assert review.holm([None]) == [None]


def test_a_difference_holds_only_where_its_interval_excludes_zero_and_its_adjusted_p_is_small():
    assert review.verdict(0.01, 0.05, 0.01, 5) == "holds"
    assert review.verdict(-0.05, -0.01, 0.01, 5) == "holds"
    assert review.verdict(0.01, 0.05, 0.07, 5) == "holds unadjusted"
    assert review.verdict(-0.01, 0.05, 0.01, 5) == "not separated"
    assert review.verdict(0.01, 0.05, 0.01, 2) == "pending: 2 of 5 seeds"


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
