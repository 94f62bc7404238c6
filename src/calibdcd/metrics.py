"""Membership-inference metrics: ROC, AUC, TPR at a fixed FPR, bootstrap confidence intervals.

Conventions (everywhere in calibdcd): labels 1 = member, 0 = non-member; higher score = member.
Ties in scores are handled as scikit-learn's ``roc_curve`` / ``roc_auc_score`` do: all texts
sharing a score cross the threshold together, so the ROC moves diagonally across a tie and the
AUC counts a tied (member, non-member) pair as one half.

Why not scikit-learn's functions, a core dependency: :func:`bootstrap_ci` calls the metric once
per replicate (1,000 per interval, about twenty intervals per setting), and
``sklearn.metrics.roc_auc_score`` takes 1.9 ms a call on 440 texts against 0.068 ms for
:func:`auc` here (28x; measured 2026-11-26 on the 2-core Intel Xeon, scikit-learn 1.x, with its
input validation). The outputs are equal: ``tests/test_metrics.py`` checks :func:`auc` and
:func:`roc_curve` against ``roc_auc_score`` and ``roc_curve(drop_intermediate=False)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

__all__ = [
    "Interval",
    "auc",
    "bootstrap_ci",
    "roc_curve",
    "tpr_at_fpr",
]


def _check(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(labels)
    s = np.asarray(scores, dtype=np.float64)
    if y.ndim != 1 or s.ndim != 1:
        raise ValueError(f"labels and scores must be 1-D, got shapes {y.shape} and {s.shape}")
    if y.shape != s.shape:
        raise ValueError(f"labels has {y.size} entries but scores has {s.size}")
    if y.size and not np.isin(y, (0, 1)).all():
        bad = y[~np.isin(y, (0, 1))][0].item()
        raise ValueError(f"labels must be 0 (non-member) or 1 (member), found {bad!r}")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores contain NaN or inf")
    y = y.astype(np.int64)
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == y.size:
        missing = "members (label 1)" if n_pos == 0 else "non-members (label 0)"
        raise ValueError(f"labels contain no {missing}: ROC metrics need both classes")
    return y, s


def roc_curve(
    labels: np.ndarray, scores: np.ndarray, *, drop_intermediate: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC points (fpr, tpr, thresholds), thresholds decreasing, starting at (0, 0) with +inf.

    One point per distinct score (a text is predicted member when score ≥ threshold).
    ``drop_intermediate=True`` removes collinear points as scikit-learn's default does; the
    default keeps them, since dropping them can hide the best operating point under an FPR budget.
    """
    y, s = _check(labels, scores)
    order = np.argsort(s, kind="mergesort")[::-1]
    s_sorted, y_sorted = s[order], y[order]
    # last index of each run of equal scores
    ends = np.r_[np.flatnonzero(np.diff(s_sorted)), y.size - 1]
    tps = np.cumsum(y_sorted)[ends].astype(np.float64)
    fps = (ends + 1) - tps
    thresholds = s_sorted[ends]
    if drop_intermediate and tps.size > 2:
        bends = np.r_[True, (np.diff(fps, 2) != 0) | (np.diff(tps, 2) != 0), True]
        tps, fps, thresholds = tps[bends], fps[bends], thresholds[bends]
    tps = np.r_[0.0, tps]
    fps = np.r_[0.0, fps]
    thresholds = np.r_[np.inf, thresholds]
    return fps / fps[-1], tps / tps[-1], thresholds


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve = P(score of a member > score of a non-member) + ½ P(tie)."""
    y, s = _check(labels, scores)
    # Mann-Whitney U with average ranks for ties: identical to the trapezoidal ROC area.
    order = np.argsort(s, kind="mergesort")
    s_sorted = s[order]
    ranks = np.empty(s.size, dtype=np.float64)
    starts = np.r_[0, np.flatnonzero(np.diff(s_sorted)) + 1]
    stops = np.r_[starts[1:], s.size]
    avg = (starts + stops + 1) / 2.0  # 1-based average rank of each tie run
    ranks[order] = np.repeat(avg, stops - starts)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    u = ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def tpr_at_fpr(labels: np.ndarray, scores: np.ndarray, fpr: float = 0.05) -> float:
    """TPR at the largest ROC point whose FPR ≤ ``fpr`` (the full ROC, ties as scikit-learn)."""
    if not (0.0 <= fpr <= 1.0):
        raise ValueError(f"fpr must lie in [0, 1], got {fpr!r}")
    f, t, _ = roc_curve(labels, scores)
    ok = f <= fpr + 1e-12
    return float(t[ok].max())


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate with a percentile bootstrap confidence interval."""

    estimate: float
    low: float
    high: float
    level: float
    n_boot: int

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return f"{self.estimate:.3f} [{self.low:.3f}, {self.high:.3f}]"


def bootstrap_ci(
    labels: np.ndarray,
    scores: np.ndarray,
    metric: Callable[[np.ndarray, np.ndarray], float] = auc,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap CI of ``metric(labels, scores)``.

    Resampling is stratified (members and non-members are resampled separately, keeping their
    counts), so every replicate has both classes. Seeded: the same inputs and seed give the same
    interval.
    """
    y, s = _check(labels, scores)
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not (0.0 < level < 1.0):
        raise ValueError(f"level must lie in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    pos = np.flatnonzero(y == 1)
    neg = np.flatnonzero(y == 0)
    stats = np.empty(n_boot)
    for b in range(n_boot):
        idx = np.r_[rng.choice(pos, pos.size), rng.choice(neg, neg.size)]
        stats[b] = metric(y[idx], s[idx])
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return Interval(
        estimate=float(metric(y, s)), low=float(low), high=float(high), level=level, n_boot=n_boot
    )
