"""The set-level test and the distribution check in bounded memory (issue 44, item 6): the
permutations and the bootstrap resamples are drawn in chunks of rows, with the same results,
bit for bit, as the one-matrix formulas they replace; the level still holds with ties; and the
memory no longer grows as n_perm × texts."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from scipy.stats import rankdata

from calibdcd.fitted.audit import distribution_check, set_level_test


def _one_matrix_p(scores, null, *, n_perm=9999, seed=0) -> tuple[float, float]:
    """(U, p) as ``set_level_test`` computed them before the chunks: every permutation at
    once, as an (n_perm, k + n) float64 matrix."""
    s = np.asarray(scores, dtype=np.float64)
    s = s[np.isfinite(s)]
    nul = np.asarray(null, dtype=np.float64)
    k, n = s.size, nul.size
    ranks = rankdata(np.r_[s, nul])
    u = float(ranks[:k].sum() - k * (k + 1) / 2)
    rng = np.random.default_rng([seed, 0x5E7])
    perm = rng.permuted(np.broadcast_to(ranks, (n_perm, k + n)), axis=1)
    u_star = perm[:, :k].sum(axis=1) - k * (k + 1) / 2
    return u, float((1 + np.sum(u_star >= u - 1e-9)) / (n_perm + 1))


@pytest.mark.parametrize("seed", [0, 1, 7, 123])
def test_chunked_permutations_give_the_one_matrix_p_value(seed):
    rng = np.random.default_rng(seed)
    for k, n, shift in ((5, 40, 0.0), (30, 60, 0.3), (120, 25, 0.1)):
        # overlap-like scores: few distinct values, many ties, some NaN to drop
        scores = np.round(rng.random(k) + shift, 1)
        scores[rng.random(k) < 0.1] = np.nan
        null = np.round(rng.random(n), 1)
        u, want = _one_matrix_p(scores, null, n_perm=999, seed=seed)
        for chunk in (None, 1, 7, 64, 999, 5000):
            got = set_level_test(scores, null, n_perm=999, seed=seed, chunk=chunk)
            assert got.statistic == u
            assert got.p_value == want, (k, n, chunk)


def test_chunked_p_value_matches_at_the_default_n_perm_and_with_a_tiny_byte_budget(monkeypatch):
    import calibdcd.fitted.audit as audit

    rng = np.random.default_rng(5)
    scores, null = rng.integers(0, 6, 80) / 5, rng.integers(0, 6, 70) / 5 - 0.05
    _, want = _one_matrix_p(scores, null, seed=3)
    assert set_level_test(scores, null, seed=3).p_value == want
    monkeypatch.setattr(audit, "SET_TEST_CHUNK_BYTES", 1000)  # a few rows per chunk
    assert set_level_test(scores, null, seed=3).p_value == want
    with pytest.raises(ValueError, match="chunk"):
        set_level_test(scores, null, chunk=0)


def test_level_holds_with_heavy_ties():
    """Suspect and null from one distribution with 4 distinct values: the rejection rate at
    alpha 0.1 stays at most alpha (binomial margin), and p is never below 1 / (n_perm + 1)."""
    rng = np.random.default_rng(11)
    alpha, trials, rejections = 0.1, 200, 0
    for _ in range(trials):
        pool = rng.integers(0, 4, 60).astype(float)
        res = set_level_test(
            pool[:20], pool[20:], alpha=alpha, n_perm=199, seed=int(rng.integers(1 << 30))
        )
        assert 1 / 200 <= res.p_value <= 1
        rejections += res.reject
    # Binomial(200, 0.1): P(X > 31) < 1 %
    assert rejections <= 31, rejections
    # and a real shift is found
    shifted = set_level_test(np.full(30, 3.0), rng.integers(0, 4, 40).astype(float), n_perm=199)
    assert shifted.reject and shifted.p_value == 1 / 200


def _traced_peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_set_test_memory_is_bounded_where_the_one_matrix_was_not():
    """At 3,000 suspect scores (200 null, 9,999 permutations) the one-matrix formula traces
    over 240 MB and the chunks under 40 MB; at 20,000 (a 1.6 GB matrix before) still under
    40 MB: the chunk is a fixed budget, not a share of n_perm."""
    rng = np.random.default_rng(0)
    null = np.round(rng.random(200), 2)
    small = np.round(rng.random(3_000), 2)
    assert _traced_peak(lambda: _one_matrix_p(small, null)) > 240e6
    assert _traced_peak(lambda: set_level_test(small, null)) < 40e6
    large = np.round(rng.random(20_000), 2)
    assert _traced_peak(lambda: set_level_test(large, null)) < 40e6


def test_bootstrap_ci_in_chunks_is_the_one_matrix_interval(monkeypatch):
    """metrics.bootstrap_ci draws and scores its resamples a chunk at a time (bounded memory:
    the distribution check of a large suspect set uses it): the interval is the one every
    resample drawn at once and scored as one matrix gives, whatever the chunk."""
    import calibdcd.metrics as metrics
    from calibdcd.roc import auc_rows

    rng = np.random.default_rng(2)
    for m, n in ((30, 12), (200, 57)):
        y = np.r_[np.ones(m, int), np.zeros(n, int)]
        s = np.round(rng.normal(size=m + n) + 0.3 * y, 1)
        draw = np.random.default_rng(4)
        pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
        dp, dn = [], []
        for _ in range(300):
            dp.append(draw.choice(pos, pos.size))
            dn.append(draw.choice(neg, neg.size))
        stats = auc_rows(s[np.array(dp)], s[np.array(dn)])
        alpha = (1.0 - 0.95) / 2.0
        want = np.quantile(stats, [alpha, 1.0 - alpha])
        for budget in (1, 8 * 8 * (m + n) * 13, 1 << 30):
            monkeypatch.setattr(metrics, "BOOTSTRAP_CHUNK_BYTES", budget)
            got = metrics.bootstrap_ci(y, s, metrics.auc, n_boot=300, seed=4)
            assert (got.low, got.high) == tuple(want), (m, n, budget)


def test_distribution_check_samples_a_large_suspect_set():
    rng = np.random.default_rng(0)
    words = "the model was trained on this corpus of python documentation pages".split()
    suspect = [" ".join(rng.choice(words, 10)) + f" s{i}" for i in range(60)]
    non = [" ".join(rng.choice(words, 10)) for _ in range(20)]
    full = distribution_check(suspect, non, n_boot=100, max_suspect=None)
    assert (full.n_suspect, full.n_suspect_used) == (60, 60)
    assert distribution_check(suspect, non, n_boot=100, max_suspect=60) == full
    part = distribution_check(suspect, non, n_boot=100, max_suspect=25)
    assert (part.n_suspect, part.n_suspect_used) == (60, 25)
    assert part == distribution_check(suspect, non, n_boot=100, max_suspect=25)  # seeded
