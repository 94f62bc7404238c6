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
* :func:`compare_builds` -- the same over several lab builds, the build as the top level
  (builds → split seeds → texts): :func:`compare` within each build, then :func:`t_interval`
  over the per-build estimates (n_builds − 1 degrees of freedom) and :func:`builds_needed`, the
  number of builds at which the observed mean and between-build SD would resolve. A bootstrap
  over three builds has ten distinct resamples and its percentile interval is about the range
  of the build means (each build drawn three times has probability 1/27 > 2.5 %), which covers
  the mean far less often than 95 %; docs/statistics.md says why the t-interval instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

from calibdcd.roc import rows_metric

__all__ = [
    "MIN_PAIRED_BOOT",
    "BuildDelta",
    "DeLong",
    "PairedDelta",
    "TInterval",
    "builds_needed",
    "combined_delong_p",
    "compare",
    "compare_builds",
    "delong",
    "paired_bootstrap",
    "t_interval",
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


class _IntervalVerdict:
    """``half_width`` and ``verdict`` of a result with an interval ``[low, high]``."""

    low: float
    high: float

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


@dataclasses.dataclass(frozen=True)
class PairedDelta(_IntervalVerdict):
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


# --------------------------------------------------------------------------------------------
# Lab builds as the top level
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TInterval:
    """Student's t-interval for the mean of a few values (the per-build estimates)."""

    estimate: float  #: their mean
    low: float
    high: float
    level: float
    n: int
    df: int  #: n − 1
    t_quantile: float  #: t_{(1 + level) / 2, df}
    sd: float  #: their SD (ddof = 1)
    se: float  #: the standard error of the mean used: sd / √n, or the within floor if larger
    within_se: float | None  #: √(Σ se_i²) / n from the values' own standard errors, if given
    floored: bool  #: the within floor set the width (the values agreed more than their noise)
    p_value: float  #: two-sided t-test of mean = 0 with the same standard error and df

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0


def t_interval(
    values: Sequence[float], *, level: float = 0.95, within_se: Sequence[float] | None = None
) -> TInterval:
    """mean ± t_{(1+level)/2, n−1} · se over ``values`` (at least two, finite), se = sd / √n.

    ``within_se``: each value's own standard error (a build's, from its bootstrap). The standard
    error of the mean is then never below what that noise alone gives the mean,
    √(Σ se_i²) / n: se = max(sd / √n, √(Σ se_i²) / n), the Knapp–Hartung interval with its
    ad hoc variance correction (Knapp & Hartung 2003; Röver, Knapp & Friede 2015) at equal
    weights. Without it, three values that agree by chance (two builds where a method changed
    nothing, Δ = 0 exactly) would give a near-zero width. With every value equal and no floor the
    interval has no width; its p-value is then 1 for a zero mean, 0 otherwise."""
    _check_boot(1, level)
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"a t-interval needs at least two values, got {x.size}")
    if not np.isfinite(x).all():
        raise ValueError("values contain NaN or inf")
    n, m = int(x.size), float(x.mean())
    sd = float(x.std(ddof=1))
    se = sd / float(np.sqrt(n))
    floor = None
    if within_se is not None:
        w = np.asarray(within_se, dtype=np.float64)
        if w.shape != x.shape or not np.isfinite(w).all() or (w < 0).any():
            raise ValueError("within_se: one finite, non-negative standard error per value")
        floor = float(np.sqrt(np.sum(w**2)) / n)
    floored = floor is not None and floor > se
    if floored:
        se = floor
    t = float(student_t.ppf(0.5 + level / 2.0, n - 1))
    half = t * se
    if se > 0:
        p = float(2.0 * student_t.sf(abs(m) / se, n - 1))
    else:
        p = 1.0 if m == 0 else 0.0
    return TInterval(estimate=m, low=m - half, high=m + half, level=level, n=n, df=n - 1,
                     t_quantile=t, sd=sd, se=se, within_se=floor, floored=floored,
                     p_value=p)  # fmt: skip


def builds_needed(
    mean: float, sd: float, *, level: float = 0.95, limit: int = 10_000
) -> int | None:
    """The fewest builds n (≥ 2) at which a t-interval over n build means with this mean and
    this SD of one build's estimate would exclude 0: t_{(1+level)/2, n−1} · sd / √n < |mean|.
    None when the mean is 0 (no number of builds resolves it) or more than ``limit`` builds
    would be needed."""
    _check_boot(1, level)
    if mean == 0 or not np.isfinite(mean) or not np.isfinite(sd) or sd < 0:
        return None
    if sd == 0:
        return 2
    q = 0.5 + level / 2.0
    # t > z, so n > (z · sd / |mean|)²; the condition is monotone in n
    n = max(2, int(np.floor((norm.ppf(q) * sd / abs(mean)) ** 2)))
    while n <= limit:
        if student_t.ppf(q, n - 1) * sd / np.sqrt(n) < abs(mean):
            return n
        n += 1
    return None


@dataclasses.dataclass(frozen=True)
class BuildDelta(_IntervalVerdict):
    """metric(A) − metric(B) with the lab build as the top level: builds → split seeds → texts.

    Each build's estimate and interval are its own hierarchical paired bootstrap (its split
    seeds, then texts: :func:`compare`); the interval over builds is :func:`t_interval` of the
    per-build estimates with n_builds − 1 degrees of freedom (see :func:`compare_builds`)."""

    metric: str
    estimate: float  #: mean over builds of the per-build estimates
    low: float
    high: float
    level: float
    n_builds: int
    df: int
    t_quantile: float
    sd_between: float  #: SD (ddof = 1) of the per-build estimates
    se: float  #: the standard error of the mean used (:class:`TInterval`)
    floored: bool  #: the builds' own noise set the width, not their spread
    p_value: float  #: t-test of the build means against 0, n_builds − 1 df
    builds_needed: int | None  #: :func:`builds_needed` at the observed mean, SD = se · √n
    per_build: tuple[PairedDelta, ...]  #: each build's own hierarchical bootstrap

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["per_build"] = [p.as_dict() for p in self.per_build]
        d["half_width"] = self.half_width
        d["verdict"] = self.verdict
        return d


def compare_builds(
    builds: Sequence[Sequence[Pool]],
    *,
    fpr: float = 0.05,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, BuildDelta]:
    """``{"auc": ΔAUC, "tpr": ΔTPR@fpr}`` of A − B with the lab build as the top level.

    ``builds[b]`` are build b's pools (one per split seed). Each build is :func:`compare` on its
    own pools (the hierarchical paired bootstrap, seeded with ``seed``): its estimate (the mean
    over its split seeds) and its within-build interval. The interval over builds is
    :func:`t_interval` of the per-build estimates, n_builds − 1 degrees of freedom, its
    standard error never below the builds' own (each build's bootstrap half-width / z). Each
    build mean carries its own split-seed and text noise, so the spread of the build means
    estimates the whole variance of one build mean: with builds of one design (the same split
    seeds and pool sizes) the t-interval over their means is the exact interval of a balanced
    nested normal model, and it needs no separate estimate of the between-build variance.
    Needs at least two builds."""
    if len(builds) < 2:
        raise ValueError(f"compare_builds needs at least two builds, got {len(builds)}")
    within = [compare(pools, fpr=fpr, n_boot=n_boot, level=level, seed=seed) for pools in builds]
    z = float(norm.ppf(0.5 + level / 2.0))
    out = {}
    for name in ("auc", "tpr"):
        per = tuple(w[name] for w in within)
        ti = t_interval(
            [p.estimate for p in per], level=level, within_se=[p.half_width / z for p in per]
        )
        out[name] = BuildDelta(
            metric=name,
            estimate=ti.estimate,
            low=ti.low,
            high=ti.high,
            level=level,
            n_builds=ti.n,
            df=ti.df,
            t_quantile=ti.t_quantile,
            sd_between=ti.sd,
            se=ti.se,
            floored=ti.floored,
            p_value=ti.p_value,
            builds_needed=builds_needed(ti.estimate, ti.se * np.sqrt(ti.n), level=level),
            per_build=per,
        )
    return out
