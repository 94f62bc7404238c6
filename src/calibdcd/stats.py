"""Paired statistics for "method A vs method B on the same texts", over several seeds.

Pure numpy (+ scipy's normal distribution). Conventions as in :mod:`calibdcd.metrics`: labels
1 = member, 0 = non-member, higher score = member.

A *pool* is one seed's evaluation pool: ``(labels, scores_a, scores_b)`` with row i the same text
for both methods. Seeds are different splits of one benchmark, so their pools share texts and
their results are correlated; nothing here assumes they are independent.

* :func:`delong` -- DeLong's paired AUC covariance for one pool (fast midrank form of Sun & Xu,
  2014; the structural components are the same as DeLong, DeLong & Clarke-Pearson, 1988).
* :func:`paired_bootstrap` -- the hierarchical paired bootstrap of Δmetric = metric(A) − metric(B):
  each replicate resamples the seeds with replacement, then, within every drawn seed, members
  and non-members of its pool separately with replacement; A and B are evaluated on the *same*
  resampled texts and the replicate is the mean over the drawn seeds. The point estimate is the
  mean over seeds of the per-seed Δ, the interval is the percentile interval, and its
  half-width is the smallest Δ the setting can resolve at that level.
* :func:`combined_delong_p` -- a p-value for ΔAUC = 0 over seeds: the per-seed DeLong statistics
  z_s are averaged and Z̄ is referred to N(0, 1). Under H0 every z_s is (asymptotically)
  standard normal, and the variance of a mean of unit-variance variables is at most 1 whatever
  their correlation (it is 1 only when they are perfectly correlated), so the test is
  conservative and valid for seeds that share texts. Fisher's or Stouffer's combination would
  assume independent seeds and would be anti-conservative here.
  (A permutation test that swaps raw scores of the two methods is not valid for AUC when the
  methods' scores have different scales; DeLong needs no such swap.)
* :func:`compare` -- ΔAUC and ΔTPR@FPR with one set of bootstrap resamples, and the p-value
  (ΔAUC only: DeLong is a test of AUCs; ΔTPR is reported with its interval).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import norm

from calibdcd.roc import rows_metric

__all__ = [
    "MIN_PAIRED_BOOT",
    "DeLong",
    "PairedDelta",
    "combined_delong_p",
    "compare",
    "delong",
    "paired_bootstrap",
]

#: replicates of the paired bootstrap at least (the experiment and the report): percentile
#: intervals from a few dozen replicates are too coarse to decide a table's marks
MIN_PAIRED_BOOT = 1000

Pool = tuple[np.ndarray, np.ndarray, np.ndarray]  #: (labels, scores_a, scores_b) of one seed


def _pool(labels: Any, a: Any, b: Any, where: str = "pool") -> Pool:
    y = np.asarray(labels).astype(np.int64)
    sa = np.asarray(a, dtype=np.float64)
    sb = np.asarray(b, dtype=np.float64)
    if y.ndim != 1 or sa.shape != y.shape or sb.shape != y.shape:
        raise ValueError(
            f"{where}: labels and both score vectors must be 1-D of one length, got shapes "
            f"{y.shape}, {sa.shape}, {sb.shape}"
        )
    if not np.isin(y, (0, 1)).all():
        raise ValueError(f"{where}: labels must be 0 or 1")
    if y.sum() == 0 or y.sum() == y.size:
        raise ValueError(f"{where}: needs both members and non-members")
    if not (np.isfinite(sa).all() and np.isfinite(sb).all()):
        raise ValueError(f"{where}: scores contain NaN or inf")
    return y, sa, sb


# --------------------------------------------------------------------------------------------
# DeLong
# --------------------------------------------------------------------------------------------


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties given their average rank."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    starts = np.r_[0, np.flatnonzero(np.diff(xs)) + 1]
    stops = np.r_[starts[1:], x.size]
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat((starts + stops + 1) / 2.0, stops - starts)
    return ranks


@dataclasses.dataclass(frozen=True)
class DeLong:
    """DeLong's estimates for two score vectors on the same texts."""

    auc_a: float
    auc_b: float
    cov: np.ndarray  #: 2x2 covariance of (AUC_a, AUC_b)

    @property
    def delta(self) -> float:
        return self.auc_a - self.auc_b

    @property
    def var_delta(self) -> float:
        return float(self.cov[0, 0] + self.cov[1, 1] - 2.0 * self.cov[0, 1])

    @property
    def z(self) -> float:
        """(AUC_a − AUC_b) / sd; 0 when both are equal, ±inf for a difference with no variance."""
        v = self.var_delta
        if v <= 1e-15:
            return 0.0 if abs(self.delta) <= 1e-12 else float(np.sign(self.delta) * np.inf)
        return float(self.delta / np.sqrt(v))

    @property
    def p_value(self) -> float:
        return float(2.0 * norm.sf(abs(self.z)))


def delong(labels: Any, scores_a: Any, scores_b: Any) -> DeLong:
    """DeLong's paired AUC estimates and covariance, O(n log n) through midranks.

    With m members X and n non-members Y, the structural components are
    V10_i = (1/n) Σ_j ψ(X_i, Y_j) and V01_j = (1/m) Σ_i ψ(X_i, Y_j) (ψ = 1 if X > Y, ½ if tied,
    0 else); cov = S10 / m + S01 / n with S10, S01 the sample covariances (ddof = 1) of the
    components of the two methods.
    """
    y, sa, sb = _pool(labels, scores_a, scores_b)
    pos, neg = y == 1, y == 0
    m, n = int(pos.sum()), int(neg.sum())
    v10 = np.empty((2, m))
    v01 = np.empty((2, n))
    aucs = np.empty(2)
    for k, s in enumerate((sa, sb)):
        x, yy = s[pos], s[neg]
        r_all = _midranks(np.r_[x, yy])
        r_x, r_y = _midranks(x), _midranks(yy)
        # rank of X_i among all minus its rank among X = number of Y below (+ ½ ties)
        v10[k] = (r_all[:m] - r_x) / n
        v01[k] = 1.0 - (r_all[m:] - r_y) / m
        aucs[k] = v10[k].mean()
    s10 = np.atleast_2d(np.cov(v10, ddof=1)) if m > 1 else np.zeros((2, 2))
    s01 = np.atleast_2d(np.cov(v01, ddof=1)) if n > 1 else np.zeros((2, 2))
    return DeLong(auc_a=float(aucs[0]), auc_b=float(aucs[1]), cov=s10 / m + s01 / n)


def combined_delong_p(pools: Sequence[Pool]) -> tuple[float, float]:
    """(mean of the per-seed DeLong z, two-sided p from N(0, 1)): conservative for correlated
    seeds (see the module doc)."""
    if not pools:
        raise ValueError("no pools")
    zs = np.array([delong(*p).z for p in pools])
    if np.isinf(zs).any():
        signs = np.sign(zs[np.isinf(zs)])
        if (signs == signs[0]).all():
            return float(signs[0] * np.inf), 0.0
        return float("nan"), float("nan")
    z = float(zs.mean())
    return z, float(2.0 * norm.sf(abs(z)))


# --------------------------------------------------------------------------------------------
# The hierarchical paired bootstrap
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PairedDelta:
    """metric(A) − metric(B) over seeds: estimate, percentile interval, its half-width, p."""

    metric: str
    estimate: float  #: mean over seeds of the per-seed Δ
    low: float
    high: float
    level: float
    n_boot: int
    n_seeds: int
    per_seed: tuple[float, ...]
    p_value: float | None = None  #: ΔAUC: combined DeLong (see module doc); None for ΔTPR
    z: float | None = None

    @property
    def half_width(self) -> float:
        """Half the interval's width: the smallest Δ this setting can resolve."""
        return (self.high - self.low) / 2.0

    @property
    def verdict(self) -> int:
        """+1 when the interval lies above 0, −1 below, 0 when it contains 0."""
        if self.low > 0.0:
            return 1
        if self.high < 0.0:
            return -1
        return 0

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["per_seed"] = list(self.per_seed)
        d["half_width"] = self.half_width
        d["verdict"] = self.verdict
        return d


def _check_boot(n_boot: int, level: float) -> None:
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not (0.0 < level < 1.0):
        raise ValueError(f"level must lie in (0, 1), got {level}")


def paired_bootstrap(
    pools: Sequence[Pool],
    metrics: Sequence[str] = ("auc", "tpr"),
    *,
    fpr: float = 0.05,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, PairedDelta]:
    """Hierarchical paired bootstrap of metric(A) − metric(B) for every metric ("auc",
    "tpr" at ``fpr``), all metrics on the same resamples (see the module doc). Vectorised: the
    resamples of one seed are drawn and scored as one (draws, texts) matrix. Seeded: same
    inputs, same intervals."""
    _check_boot(n_boot, level)
    if not pools:
        raise ValueError("paired_bootstrap needs at least one pool")
    pools = [_pool(*p, where=f"pool {i}") for i, p in enumerate(pools)]
    fns = {name: rows_metric(name, fpr) for name in metrics}
    rng = np.random.default_rng(seed)
    n_seeds = len(pools)
    draw = rng.integers(0, n_seeds, size=(n_boot, n_seeds))  # level 1: seeds per replicate
    sums = {name: np.zeros(n_boot) for name in fns}
    per_seed: dict[str, list[float]] = {name: [] for name in fns}
    for s, (y, a, b) in enumerate(pools):
        pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
        for name, fn in fns.items():
            d0 = fn(a[pos][None], a[neg][None]) - fn(b[pos][None], b[neg][None])
            per_seed[name].append(float(d0[0]))
        rep, _slot = np.nonzero(draw == s)  # replicate of every draw of this seed
        if rep.size == 0:
            continue
        # level 2: texts within the seed's pool, stratified by label, same rows for A and B
        ip = pos[rng.integers(0, pos.size, size=(rep.size, pos.size))]
        ineg = neg[rng.integers(0, neg.size, size=(rep.size, neg.size))]
        for name, fn in fns.items():
            delta = fn(a[ip], a[ineg]) - fn(b[ip], b[ineg])
            np.add.at(sums[name], rep, delta)
    alpha = (1.0 - level) / 2.0
    out = {}
    for name in fns:
        stats = sums[name] / n_seeds
        low, high = np.quantile(stats, [alpha, 1.0 - alpha])
        out[name] = PairedDelta(
            metric=name,
            estimate=float(np.mean(per_seed[name])),
            low=float(low),
            high=float(high),
            level=level,
            n_boot=n_boot,
            n_seeds=n_seeds,
            per_seed=tuple(per_seed[name]),
        )
    return out


def compare(
    pools: Sequence[Pool],
    *,
    fpr: float = 0.05,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, PairedDelta]:
    """``{"auc": ΔAUC, "tpr": ΔTPR@fpr}`` of A − B over the seeds' pools (same resamples), with
    the combined DeLong p-value on ΔAUC."""
    res = paired_bootstrap(
        pools,
        ("auc", "tpr"),
        fpr=fpr,
        n_boot=n_boot,
        level=level,
        seed=seed,
    )
    z, p = combined_delong_p(pools)
    res["auc"] = dataclasses.replace(res["auc"], p_value=p, z=z)
    return res
