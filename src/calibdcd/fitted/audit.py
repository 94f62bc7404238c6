"""What ``calibdcd score`` reports besides per-text scores: empirical p-values and decisions
against held-out known non-members, a set-level test, and a model-free check of the reference.

* :func:`empirical_p_values`: p(s) = (1 + #{null ≥ s}) / (n + 1) against the n held-out known
  non-members' scores (the conformal form: under exchangeability P(p ≤ α) ≤ α for a non-member).
* :func:`threshold_at` / decisions: "member" iff p ≤ α, i.e. the score is above the
  ⌊α (n + 1)⌋-th largest null score; the false-positive rate on fresh non-members is at most α
  (exactly ⌊α (n + 1)⌋ / (n + 1) in expectation).
* :func:`set_level_test`: is a whole set of suspect texts more member-like than the known
  non-members? One-sided Mann–Whitney U on their scores (dataset-inference style), p-value by
  permutation of the pooled scores (valid level with ties).
* :func:`distribution_check`: whether the suspect texts and the known non-members differ *as
  texts* (the blind TF-IDF classifier of :mod:`calibdcd.blind`, cross-validated AUC between the
  two sets with a bootstrap interval). When they do, a set-level rejection may come from the
  distribution shift rather than from the model: the check warns.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "DistributionCheck",
    "SetTest",
    "distribution_check",
    "empirical_p_values",
    "set_level_test",
    "threshold_at",
]


def empirical_p_values(scores: np.ndarray, null: np.ndarray) -> np.ndarray:
    """(1 + #{null ≥ s}) / (n + 1) for each score (NaN for a NaN score)."""
    s = np.asarray(scores, dtype=np.float64)
    nul = np.sort(np.asarray(null, dtype=np.float64))
    if nul.size == 0 or not np.all(np.isfinite(nul)):
        raise ValueError("the null scores must be a non-empty set of finite numbers")
    ge = nul.size - np.searchsorted(nul, s, side="left")  # #{null >= s}
    p = (1.0 + ge) / (nul.size + 1.0)
    return np.where(np.isfinite(s), p, np.nan)


def threshold_at(null: np.ndarray, fpr: float) -> float:
    """The decision threshold of ``p ≤ fpr``: a score is "member" iff it is strictly above the
    returned value (+inf when ``fpr`` < 1 / (n + 1): no score can be declared a member)."""
    nul = np.sort(np.asarray(null, dtype=np.float64))[::-1]
    k = math.floor(fpr * (nul.size + 1) + 1e-12)
    if k < 1:
        return math.inf
    return float(nul[min(k, nul.size) - 1])


@dataclasses.dataclass(frozen=True)
class SetTest:
    """One-sided Mann–Whitney U: suspect scores stochastically greater than the null's."""

    n_suspect: int
    n_null: int
    statistic: float  #: U of the suspect set
    auc: float  #: U / (n_suspect n_null): P(suspect > null) + ties/2
    p_value: float
    alpha: float
    reject: bool  #: p ≤ alpha: the set is more member-like than the known non-members

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def set_level_test(
    scores: np.ndarray,
    null: np.ndarray,
    *,
    alpha: float = 0.05,
    n_perm: int = 9999,
    seed: int = 0,
) -> SetTest:
    """One-sided Mann–Whitney U of the suspect scores against the null scores, its p-value by
    permutation (``n_perm`` seeded relabellings of the pooled scores, ``(1 + #{U* ≥ U}) /
    (n_perm + 1)``): its level holds under exchangeability whatever the ties (the overlap
    detector's scores have many)."""
    from scipy.stats import rankdata

    s = np.asarray(scores, dtype=np.float64)
    s = s[np.isfinite(s)]
    nul = np.asarray(null, dtype=np.float64)
    if s.size == 0:
        raise ValueError("no finite suspect scores to test")
    k, n = s.size, nul.size
    ranks = rankdata(np.r_[s, nul])  # midranks
    u = float(ranks[:k].sum() - k * (k + 1) / 2)
    rng = np.random.default_rng([seed, 0x5E7])
    perm = rng.permuted(np.broadcast_to(ranks, (n_perm, k + n)), axis=1)
    u_star = perm[:, :k].sum(axis=1) - k * (k + 1) / 2
    p = float((1 + np.sum(u_star >= u - 1e-9)) / (n_perm + 1))
    return SetTest(
        n_suspect=int(k),
        n_null=int(n),
        statistic=u,
        auc=u / (k * n),
        p_value=p,
        alpha=alpha,
        reject=bool(p <= alpha),
    )


@dataclasses.dataclass(frozen=True)
class DistributionCheck:
    """Cross-validated blind AUC between the suspect texts and the known non-members."""

    auc: float
    low: float
    high: float
    level: float
    folds: int
    differ: bool  #: the interval lies above ``margin`` + 0.5
    margin: float
    warning: str | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def distribution_check(
    suspect: Sequence[str],
    nonmembers: Sequence[str],
    *,
    folds: int = 5,
    n_boot: int = 1000,
    level: float = 0.95,
    margin: float = 0.0,
    seed: int = 0,
) -> DistributionCheck:
    """Out-of-fold decision values of the blind classifier (TF-IDF word 1-2-grams + logistic
    regression, :func:`calibdcd.blind.blind_scores`) trained to tell the suspect texts (1) from
    the known non-members (0), stratified ``folds``-fold; AUC with a percentile bootstrap
    interval. ``differ`` when the interval's lower end exceeds 0.5 + ``margin``."""
    from sklearn.model_selection import StratifiedKFold

    from calibdcd.blind import blind_scores
    from calibdcd.metrics import auc, bootstrap_ci

    texts = list(suspect) + list(nonmembers)
    y = np.r_[np.ones(len(suspect), dtype=int), np.zeros(len(nonmembers), dtype=int)]
    k = max(2, min(folds, len(suspect), len(nonmembers)))
    if min(len(suspect), len(nonmembers)) < 2:
        raise ValueError("the distribution check needs at least 2 texts on each side")
    oof = np.zeros(len(texts))
    for tr, te in StratifiedKFold(k, shuffle=True, random_state=seed).split(texts, y):
        oof[te] = blind_scores([texts[i] for i in tr], y[tr], [texts[i] for i in te], seed=seed)
    iv = bootstrap_ci(y, oof, auc, n_boot=n_boot, level=level, seed=seed)
    differ = bool(iv.low > 0.5 + margin)
    warning = None
    if differ:
        warning = (
            f"the suspect texts and the known non-members differ as texts: a model-free "
            f"classifier tells them apart with AUC {iv.estimate:.3f} "
            f"[{iv.low:.3f}, {iv.high:.3f}] (cross-validated, no model queried). The set-level "
            "test and the p-values compare against non-members of another distribution; "
            "a rejection may reflect that shift rather than membership. Use known non-members "
            "from the suspect texts' distribution."
        )
    return DistributionCheck(
        auc=float(iv.estimate),
        low=float(iv.low),
        high=float(iv.high),
        level=level,
        folds=k,
        differ=differ,
        margin=margin,
        warning=warning,
    )
