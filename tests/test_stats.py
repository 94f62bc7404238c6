"""Paired statistics on hand-built inputs: DeLong against a brute-force reference, the
hierarchical paired bootstrap on cases whose answer is known, the combined p-value's size."""

from __future__ import annotations

import numpy as np
import pytest

from calibdcd.metrics import auc, tpr_at_fpr
from calibdcd.roc import auc_rows, tpr_rows
from calibdcd.stats import (
    combined_delong_p,
    compare,
    delong,
    paired_bootstrap,
)


def _brute_delong(y, a, b):
    """DeLong's covariance straight from the definition: the full ψ matrix, double loops."""
    y = np.asarray(y)
    out_v10, out_v01, aucs = [], [], []
    for s in (np.asarray(a, float), np.asarray(b, float)):
        x, z = s[y == 1], s[y == 0]
        psi = np.array([[1.0 if xi > zj else 0.5 if xi == zj else 0.0 for zj in z] for xi in x])
        out_v10.append(psi.mean(axis=1))
        out_v01.append(psi.mean(axis=0))
        aucs.append(psi.mean())
    m, n = len(out_v10[0]), len(out_v01[0])
    s10 = np.array([[np.sum((u - u.mean()) * (v - v.mean())) / (m - 1) for v in out_v10]
                    for u in out_v10])  # fmt: skip
    s01 = np.array([[np.sum((u - u.mean()) * (v - v.mean())) / (n - 1) for v in out_v01]
                    for u in out_v01])  # fmt: skip
    return aucs, s10 / m + s01 / n


@pytest.mark.parametrize("seed", range(12))
def test_delong_matches_brute_force_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(6, 40))
    y = rng.integers(0, 2, n)
    y[:2] = [0, 1]
    if seed % 2:  # heavy ties
        a, b = rng.integers(0, 4, n).astype(float), rng.integers(0, 3, n).astype(float)
    else:
        a, b = rng.normal(size=n) + y, rng.normal(size=n) * 10 + 0.5 * y
    d = delong(y, a, b)
    (ra, rb), cov = _brute_delong(y, a, b)
    assert d.auc_a == pytest.approx(ra) == pytest.approx(auc(y, a))
    assert d.auc_b == pytest.approx(rb) == pytest.approx(auc(y, b))
    np.testing.assert_allclose(d.cov, cov, atol=1e-13)


def test_delong_hand_values():
    # members 3, 2; non-members 1, 2 -> psi = [[1, 1], [1, .5]]: AUC .875
    y = [1, 1, 0, 0]
    d = delong(y, [3, 2, 1, 2], [3, 2, 1, 2])
    assert d.auc_a == 0.875 and d.delta == 0.0 and d.z == 0.0 and d.p_value == 1.0
    # v10 = [1, .75] (var .03125), v01 = [1, .75] (var .03125): var = .03125/2 * 2
    assert d.cov[0, 0] == pytest.approx(0.03125)


@pytest.mark.parametrize("seed", range(8))
def test_row_metrics_match_the_scalar_metrics(seed):
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(1, 30)), int(rng.integers(1, 60))
    tied = seed % 2
    pos = rng.integers(0, 5, (6, m)).astype(float) if tied else rng.normal(size=(6, m)) + 1
    neg = rng.integers(0, 5, (6, n)).astype(float) if tied else rng.normal(size=(6, n))
    y = np.r_[np.ones(m), np.zeros(n)].astype(int)
    got_auc = auc_rows(pos, neg)
    for fpr in (0.0, 0.01, 0.05, 0.1, 0.5, 1.0):
        got = tpr_rows(pos, neg, fpr)
        for i in range(6):
            s = np.r_[pos[i], neg[i]]
            assert got[i] == pytest.approx(tpr_at_fpr(y, s, fpr))
            assert got_auc[i] == pytest.approx(auc(y, s))


def test_identical_scores_give_zero_delta_and_zero_width():
    rng = np.random.default_rng(0)
    pools = []
    for _ in range(3):
        y = np.r_[np.ones(30), np.zeros(30)].astype(int)
        s = rng.normal(size=60) + y
        pools.append((y, s, s.copy()))
    res = compare(pools, n_boot=200)
    for d in res.values():
        assert d.estimate == 0.0 and d.low == 0.0 and d.high == 0.0 and d.half_width == 0.0
        assert d.verdict == 0 and d.n_seeds == 3
    assert res["auc"].p_value == 1.0


def test_a_monotone_rescaling_is_no_difference():
    rng = np.random.default_rng(1)
    y = np.r_[np.ones(40), np.zeros(40)].astype(int)
    s = rng.normal(size=80) + y
    res = compare([(y, s, np.exp(3 * s) - 7)], n_boot=100)
    assert res["auc"].half_width == 0.0 and res["auc"].p_value == 1.0


def test_planted_difference_is_resolved_and_its_sign_kept():
    rng = np.random.default_rng(2)
    pools = []
    for _ in range(3):
        y = np.r_[np.ones(150), np.zeros(150)].astype(int)
        noise = rng.normal(size=300)
        good = noise + 1.5 * y
        bad = noise + 0.3 * y + rng.normal(size=300)
        pools.append((y, good, bad))
    res = compare(pools, n_boot=300, seed=3)
    d = res["auc"]
    assert d.low > 0.1 and d.verdict == 1 and d.p_value < 1e-6 and d.z > 0
    assert d.estimate == pytest.approx(np.mean([auc(y, a) - auc(y, b) for y, a, b in pools]))
    assert d.low < d.estimate < d.high
    assert res["tpr"].verdict == 1
    flipped = compare([(y, b, a) for y, a, b in pools], n_boot=300, seed=3)["auc"]
    assert flipped.verdict == -1 and flipped.estimate == pytest.approx(-d.estimate)
    assert flipped.low == pytest.approx(-d.high) and flipped.high == pytest.approx(-d.low)


def test_bootstrap_resamples_seeds_then_texts():
    """Two seeds with opposite, exactly known differences: the seed level alone spreads the
    interval over both (a bootstrap that averaged seeds first would give a point mass at 0)."""
    y = np.r_[np.ones(20), np.zeros(20)].astype(int)
    perfect = np.r_[np.ones(20), np.zeros(20)]
    useless = np.zeros(40)
    pools = [(y, perfect, useless), (y, useless, perfect)]
    d = paired_bootstrap(pools, ("auc",), n_boot=400, seed=0)["auc"]
    assert d.per_seed == (0.5, -0.5) and d.estimate == 0.0
    # each replicate draws (s1, s1), (s1, s2) or (s2, s2): means +.5, 0, -.5 (texts cannot change
    # a perfect or a constant score's AUC)
    assert d.low == -0.5 and d.high == 0.5 and d.verdict == 0


def test_seeded_and_validated():
    rng = np.random.default_rng(4)
    y = np.r_[np.ones(25), np.zeros(25)].astype(int)
    a, b = rng.normal(size=50) + y, rng.normal(size=50)
    one = compare([(y, a, b)], n_boot=50, seed=7)
    assert one == compare([(y, a, b)], n_boot=50, seed=7)
    assert one["auc"].as_dict()["half_width"] == one["auc"].half_width
    with pytest.raises(ValueError, match="pool 0: needs both"):
        paired_bootstrap([(np.ones(4), a[:4], b[:4])])
    with pytest.raises(ValueError, match="one length"):
        paired_bootstrap([(y, a, b[:3])])
    with pytest.raises(ValueError, match="n_boot"):
        compare([(y, a, b)], n_boot=0)
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        paired_bootstrap([(y, a, b)], metrics=("auc", "f1"))


def test_combined_p_is_not_anti_conservative_under_the_null():
    """Two methods with equal AUC on correlated seeds (the same texts re-split): the combined
    test rejects at most about α of the time."""
    rng = np.random.default_rng(5)
    rejections = 0
    trials = 300
    for _ in range(trials):
        n = 120
        y = np.r_[np.ones(n // 2), np.zeros(n // 2)].astype(int)
        a = rng.normal(size=n) + 0.8 * y
        b = rng.normal(size=n) + 0.8 * y
        pools = []
        for _ in range(3):  # three overlapping sub-pools of the same texts
            keep = np.sort(np.r_[rng.choice(n // 2, 45, replace=False),
                                 n // 2 + rng.choice(n // 2, 45, replace=False)])  # fmt: skip
            pools.append((y[keep], a[keep], b[keep]))
        _, p = combined_delong_p(pools)
        rejections += p < 0.05
    assert rejections / trials <= 0.07
