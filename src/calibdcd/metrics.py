"""Membership-inference metrics: ROC, AUC, TPR at a fixed FPR, bootstrap confidence intervals.

Conventions (everywhere in calibdcd): labels 1 = member, 0 = non-member; higher score = member.
Ties in scores are handled as scikit-learn's ``roc_curve`` / ``roc_auc_score`` do: all texts
sharing a score cross the threshold together, so the ROC moves diagonally across a tie and the
AUC counts a tied (member, non-member) pair as one half.

Single statistics are scikit-learn's (``roc_curve``, ``roc_auc_score``) on checked inputs. A
bootstrap interval scores its 1,000 resamples at once with :mod:`calibdcd.roc` (the vectorised
hot loop, hand-written for speed; its module doc has the measurement) when the metric is
:func:`auc` or :class:`TprAtFpr`; any other metric is called once per resample.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

__all__ = [
    "Interval",
    "TprAtFpr",
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

    One point per distinct score (a text is predicted member when score ≥ threshold):
    scikit-learn's ``roc_curve``. ``drop_intermediate=True`` removes collinear points as
    scikit-learn's default does; the default keeps them, since dropping them can hide the best
    operating point under an FPR budget.
    """
    from sklearn.metrics import roc_curve as _roc_curve

    y, s = _check(labels, scores)
    return _roc_curve(y, s, drop_intermediate=drop_intermediate)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve = P(score of a member > score of a non-member) + ½ P(tie)
    (scikit-learn's ``roc_auc_score``)."""
    from sklearn.metrics import roc_auc_score

    y, s = _check(labels, scores)
    return float(roc_auc_score(y, s))


def tpr_at_fpr(labels: np.ndarray, scores: np.ndarray, fpr: float = 0.05) -> float:
    """TPR at the largest ROC point whose FPR ≤ ``fpr`` (the full ROC, ties as scikit-learn)."""
    if not (0.0 <= fpr <= 1.0):
        raise ValueError(f"fpr must lie in [0, 1], got {fpr!r}")
    f, t, _ = roc_curve(labels, scores)
    ok = f <= fpr + 1e-12
    return float(t[ok].max())


@dataclasses.dataclass(frozen=True)
class TprAtFpr:
    """The metric "TPR at ``fpr``" as one object (:func:`tpr_at_fpr`), so that
    :func:`bootstrap_ci` can score its resamples at once."""

    fpr: float = 0.05

    def __call__(self, labels: np.ndarray, scores: np.ndarray) -> float:
        return tpr_at_fpr(labels, scores, self.fpr)


def _rows_metric(metric: Callable) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    from calibdcd.roc import rows_metric

    if metric is auc:
        return rows_metric("auc")
    if isinstance(metric, TprAtFpr):
        return rows_metric("tpr", metric.fpr)
    return None


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


#: bytes of bootstrap resamples :func:`bootstrap_ci` holds at once
BOOTSTRAP_CHUNK_BYTES = 16 << 20


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
    rows = _rows_metric(metric)
    # resamples drawn and scored a chunk at a time (bounded memory for large sets: a row
    # scorer holds several (resamples, texts) arrays); the draws keep one order whatever the
    # chunk, so the interval does not depend on it
    chunk = max(1, min(n_boot, BOOTSTRAP_CHUNK_BYTES // (8 * 8 * max(1, s.size))))
    draws_pos = np.empty((chunk, pos.size), dtype=np.int64)
    draws_neg = np.empty((chunk, neg.size), dtype=np.int64)
    stats = np.empty(n_boot)
    for start in range(0, n_boot, chunk):
        m = min(chunk, n_boot - start)
        for b in range(m):  # each resample's members, then its non-members
            draws_pos[b] = rng.choice(pos, pos.size)
            draws_neg[b] = rng.choice(neg, neg.size)
        if rows is not None:  # the chunk's resamples scored as one matrix
            stats[start : start + m] = rows(s[draws_pos[:m]], s[draws_neg[:m]])
        else:
            for b in range(m):
                idx = np.r_[draws_pos[b], draws_neg[b]]
                stats[start + b] = metric(y[idx], s[idx])
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return Interval(
        estimate=float(metric(y, s)), low=float(low), high=float(high), level=level, n_boot=n_boot
    )
