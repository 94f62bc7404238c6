"""Metrics are scikit-learn's on checked inputs (checked here against the definitions by brute
force), and a bootstrap's vectorised resamples equal the per-resample loop."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score
from sklearn.metrics import roc_curve as sk_roc_curve

from calibdcd.metrics import TprAtFpr, auc, bootstrap_ci, roc_curve, tpr_at_fpr


def _sk_tpr_at_fpr(y, s, target):
    f, t, _ = sk_roc_curve(y, s, drop_intermediate=False)
    return t[f <= target + 1e-12].max()


@pytest.mark.parametrize("seed", range(20))
def test_agrees_with_sklearn_on_random_data_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 300))
    y = rng.integers(0, 2, size=n)
    y[0], y[1] = 0, 1
    # heavy ties for half the seeds
    s = rng.integers(0, 6, size=n).astype(float) if seed % 2 else rng.normal(size=n) + y
    assert auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    for drop in (False, True):
        f, t, th = roc_curve(y, s, drop_intermediate=drop)
        sf, st, sth = sk_roc_curve(y, s, drop_intermediate=drop)
        np.testing.assert_allclose(f, sf)
        np.testing.assert_allclose(t, st)
        np.testing.assert_allclose(th[1:], sth[1:])
        assert np.isinf(th[0])
    for target in (0.0, 0.01, 0.05, 0.1, 0.5, 1.0):
        assert tpr_at_fpr(y, s, target) == pytest.approx(_sk_tpr_at_fpr(y, s, target))


def test_hand_built_values():
    y = np.array([0, 0, 1, 1])
    assert auc(y, [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert auc(y, [1, 1, 1, 1]) == 0.5  # all tied: chance
    assert auc(y, [0, 0, 1, 1]) == 1.0
    assert auc(y, [1, 1, 0, 0]) == 0.0
    # 20 non-members, 10 members: FPR steps of 0.05
    y = np.r_[np.zeros(20), np.ones(10)].astype(int)
    s = np.r_[np.arange(20), np.arange(10) + 17.5]  # non-members 0..19, members 17.5..26.5
    # FPR 0: threshold above 19 -> members 19.5..26.5, 8 of 10
    assert tpr_at_fpr(y, s, 0.0) == pytest.approx(0.8)
    # one non-member (19) allowed: threshold 18.5 -> 9 of 10
    assert tpr_at_fpr(y, s, 0.05) == pytest.approx(0.9)
    assert tpr_at_fpr(y, s, 0.07) == pytest.approx(0.9)
    assert tpr_at_fpr(y, s, 0.10) == pytest.approx(1.0)


def test_tie_crossing_the_budget_is_not_counted_partially():
    # a member tied with a non-member: both cross together; with a budget of 0 FPR, TPR = 0
    y = np.array([1, 0, 0, 0])
    s = np.array([0.9, 0.9, 0.1, 0.2])
    assert tpr_at_fpr(y, s, 0.0) == 0.0
    assert tpr_at_fpr(y, s, 1 / 3) == 1.0


def test_missing_class_and_bad_labels_raise():
    with pytest.raises(ValueError, match="no members"):
        auc([0, 0, 0], [1, 2, 3])
    with pytest.raises(ValueError, match="no non-members"):
        tpr_at_fpr([1, 1], [1, 2])
    with pytest.raises(ValueError, match="found 2"):
        auc([0, 1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="3 entries"):
        auc([0, 1, 1], [1, 2])
    with pytest.raises(ValueError, match="NaN"):
        auc([0, 1], [np.nan, 1.0])
    with pytest.raises(ValueError, match="fpr"):
        tpr_at_fpr([0, 1], [0, 1], fpr=1.5)


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    rng = np.random.default_rng(0)
    y = np.r_[np.zeros(100), np.ones(100)].astype(int)
    s = rng.normal(size=200) + 0.8 * y
    a = bootstrap_ci(y, s, n_boot=300, seed=1)
    b = bootstrap_ci(y, s, n_boot=300, seed=1)
    c = bootstrap_ci(y, s, n_boot=300, seed=2)
    assert a == b and a != c
    assert a.low < a.estimate < a.high
    assert a.estimate == pytest.approx(roc_auc_score(y, s))
    # an AUC CI for n=200 is a few points wide, not degenerate and not huge
    assert 0.04 < a.high - a.low < 0.25
    t = bootstrap_ci(y, s, lambda yy, ss: tpr_at_fpr(yy, ss, 0.05), n_boot=200)
    assert 0.0 <= t.low <= t.estimate <= t.high <= 1.0


def _brute_auc(y, s):
    """P(member > non-member) + ½ P(tie), over every pair."""
    pos, neg = s[y == 1], s[y == 0]
    diff = pos[:, None] - neg[None, :]
    return ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size


def _brute_tpr(y, s, target):
    """The largest TPR over every threshold (each distinct score, and above all) whose FPR is
    within the budget."""
    best = 0.0
    for thr in np.r_[np.inf, np.unique(s)]:
        pred = s >= thr
        if pred[y == 0].mean() <= target + 1e-12:
            best = max(best, pred[y == 1].mean())
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_metrics_are_their_definitions(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(6, 120))
    y = rng.integers(0, 2, size=n)
    y[0], y[1] = 0, 1
    s = rng.integers(0, 5, size=n).astype(float) if seed % 2 else rng.normal(size=n) + y
    assert auc(y, s) == pytest.approx(_brute_auc(y, s), abs=1e-12)
    for target in (0.0, 0.05, 0.2, 1.0):
        assert tpr_at_fpr(y, s, target) == pytest.approx(_brute_tpr(y, s, target))


@pytest.mark.parametrize("seed", range(4))
def test_a_bootstraps_vectorised_resamples_equal_the_loop(seed):
    """AUC and TPR intervals score their resamples as one matrix (calibdcd.roc); the same
    metric given as an opaque callable runs the per-resample loop on the same draws."""
    rng = np.random.default_rng(seed)
    y = np.r_[np.zeros(70), np.ones(40)].astype(int)
    s = rng.integers(0, 8, size=110).astype(float) if seed % 2 else rng.normal(size=110) + y
    for fast, slow in (
        (auc, lambda a, b: auc(a, b)),
        (TprAtFpr(0.05), lambda a, b: tpr_at_fpr(a, b, 0.05)),
        (TprAtFpr(0.2), lambda a, b: tpr_at_fpr(a, b, 0.2)),
    ):
        v = bootstrap_ci(y, s, fast, n_boot=200, seed=seed)
        loop = bootstrap_ci(y, s, slow, n_boot=200, seed=seed)
        assert v.estimate == loop.estimate
        assert v.low == pytest.approx(loop.low, abs=1e-12)
        assert v.high == pytest.approx(loop.high, abs=1e-12)
