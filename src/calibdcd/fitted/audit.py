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
* :func:`cross_validated_separation`: what ``fit`` reports about the detector itself: how well
  the whole fit (classifier, CalibDCD, retraining) ranks the known members above the known
  non-members it did not train on, as a stratified k-fold cross-validated AUC over the
  supervised texts' features (already extracted: no model query) with a bootstrap interval; a
  warning when the interval does not exclude chance (0.5).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "DistributionCheck",
    "Separation",
    "SetTest",
    "cross_validated_separation",
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


#: bytes of permuted ranks held at once by :func:`set_level_test` (one chunk of rows)
SET_TEST_CHUNK_BYTES = 16 << 20


def set_level_test(
    scores: np.ndarray,
    null: np.ndarray,
    *,
    alpha: float = 0.05,
    n_perm: int = 9999,
    seed: int = 0,
    chunk: int | None = None,
) -> SetTest:
    """One-sided Mann–Whitney U of the suspect scores against the null scores, its p-value by
    permutation (``n_perm`` seeded relabellings of the pooled scores, ``(1 + #{U* ≥ U}) /
    (n_perm + 1)``): its level holds under exchangeability whatever the ties (the overlap
    detector's scores have many).

    The relabellings are drawn ``chunk`` rows at a time (default: as many as fit in
    :data:`SET_TEST_CHUNK_BYTES`), so memory stays O(chunk × (k + n)) rather than
    O(n_perm × (k + n)). ``Generator.permuted(..., axis=1)`` shuffles row after row from one
    stream, so drawing the rows in chunks consumes the stream exactly as one matrix would: the
    U* and the p-value are the same, bit for bit, whatever ``chunk`` (a test checks it against
    the one-matrix formula). The midranks are held doubled as integers (exact: they are
    multiples of ½), and each U* summed exactly in int64."""
    from scipy.stats import rankdata

    s = np.asarray(scores, dtype=np.float64)
    s = s[np.isfinite(s)]
    nul = np.asarray(null, dtype=np.float64)
    if s.size == 0:
        raise ValueError("no finite suspect scores to test")
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk!r}")
    k, n = s.size, nul.size
    ranks = rankdata(np.r_[s, nul])  # midranks
    u = float(ranks[:k].sum() - k * (k + 1) / 2)
    # 2 × midrank is an integer <= 2 (k + n); int32 holds it below 2**31
    twice = np.rint(2.0 * ranks).astype(np.int32 if 2 * (k + n) < 2**31 else np.int64)
    rows = chunk or max(1, SET_TEST_CHUNK_BYTES // (twice.size * twice.itemsize))
    rows = min(rows, max(n_perm, 1))
    buf = np.empty((rows, k + n), dtype=twice.dtype)
    u_star = np.empty(n_perm, dtype=np.float64)
    rng = np.random.default_rng([seed, 0x5E7])
    for start in range(0, n_perm, rows):
        m = min(rows, n_perm - start)
        part = buf[:m]
        part[...] = twice
        rng.permuted(part, axis=1, out=part)
        u_star[start : start + m] = part[:, :k].sum(axis=1, dtype=np.int64) * 0.5
    u_star -= k * (k + 1) / 2
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
    n_suspect: int = 0  #: suspect texts given
    n_suspect_used: int = 0  #: of them, in the check (a seeded sample above ``max_suspect``)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: suspect texts the distribution check uses at most (a seeded sample of a larger set)
DISTRIBUTION_MAX_SUSPECT = 5000


def distribution_check(
    suspect: Sequence[str],
    nonmembers: Sequence[str],
    *,
    folds: int = 5,
    n_boot: int = 1000,
    level: float = 0.95,
    margin: float = 0.0,
    seed: int = 0,
    max_suspect: int | None = DISTRIBUTION_MAX_SUSPECT,
) -> DistributionCheck:
    """Out-of-fold decision values of the blind classifier (TF-IDF word 1-2-grams + logistic
    regression, :func:`calibdcd.blind.blind_scores`) trained to tell the suspect texts (1) from
    the known non-members (0), stratified ``folds``-fold; AUC with a percentile bootstrap
    interval. ``differ`` when the interval's lower end exceeds 0.5 + ``margin``.

    More than ``max_suspect`` suspect texts (None: no limit) are checked on a seeded random
    sample of that many, in their order: the TF-IDF vocabulary of 100,000 texts alone takes
    hundreds of MB, and the interval's width is set by the smaller side (the known
    non-members, a few hundred), so a sample of thousands gives nearly the same interval of the
    same AUC."""
    from sklearn.model_selection import StratifiedKFold

    from calibdcd.blind import blind_scores
    from calibdcd.metrics import auc, bootstrap_ci

    if min(len(suspect), len(nonmembers)) < 2:
        raise ValueError("the distribution check needs at least 2 texts on each side")
    if max_suspect is not None and max_suspect < 2:
        raise ValueError(f"max_suspect must be >= 2 or None, got {max_suspect!r}")
    n_suspect = len(suspect)
    sus = list(suspect)
    if max_suspect is not None and n_suspect > max_suspect:
        pick = np.random.default_rng([seed, 0xD15]).choice(n_suspect, max_suspect, replace=False)
        sus = [sus[i] for i in np.sort(pick)]
    texts = sus + list(nonmembers)
    y = np.r_[np.ones(len(sus), dtype=int), np.zeros(len(nonmembers), dtype=int)]
    k = max(2, min(folds, len(sus), len(nonmembers)))
    oof = np.zeros(len(texts))
    for tr, te in StratifiedKFold(k, shuffle=True, random_state=seed).split(texts, y):
        oof[te] = blind_scores([texts[i] for i in tr], y[tr], [texts[i] for i in te], seed=seed)
    iv = bootstrap_ci(y, oof, auc, n_boot=n_boot, level=level, seed=seed)  # in bounded memory
    differ = bool(iv.low > 0.5 + margin)
    warning = None
    if differ:
        sample = (
            f" (on a random {len(sus):,} of the {n_suspect:,} suspect texts)"
            if len(sus) < n_suspect
            else ""
        )
        warning = (
            f"the suspect texts and the known non-members differ as texts: a model-free "
            f"classifier tells them apart with AUC {iv.estimate:.3f} "
            f"[{iv.low:.3f}, {iv.high:.3f}] (cross-validated, no model queried{sample}). The "
            "set-level test and the p-values compare against non-members of another "
            "distribution; a rejection may reflect that shift rather than membership. Use known "
            "non-members from the suspect texts' distribution."
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
        n_suspect=n_suspect,
        n_suspect_used=len(sus),
    )


@dataclasses.dataclass(frozen=True)
class Separation:
    """How well a fit ranks known members above known non-members it did not train on: the
    AUC of out-of-fold scores (stratified k-fold over the supervised texts) with a bootstrap
    interval. ``auc`` is None when the check could not run (``skipped`` says why)."""

    auc: float | None
    low: float | None
    high: float | None
    level: float
    folds: int
    n_members: int
    n_nonmembers: int
    method: str
    beats_chance: bool | None  #: the interval lies above 0.5
    warning: str | None
    skipped: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def line(self) -> str:
        """One line for a person: the AUC, its interval and what it rests on."""
        if self.auc is None:
            return f"no cross-validated AUC on the known texts ({self.skipped})"
        assert self.low is not None and self.high is not None
        return (
            f"cross-validated AUC on the known texts {self.auc:.3f} "
            f"[{self.low:.3f}, {self.high:.3f}] ({self.folds}-fold over {self.n_members} "
            f"members and {self.n_nonmembers} non-members, {self.level:.0%} bootstrap interval)"
        )


def _folds_for(counts: Sequence[int], folds: int, min_train: int) -> int:
    """The most folds (2 to ``folds``) whose every training part keeps at least ``min_train``
    texts of each class (0: none can)."""
    for k in range(min(folds, *counts), 1, -1):
        if all(c - math.ceil(c / k) >= min_train for c in counts):
            return k
    return 0


def cross_validated_separation(
    z: np.ndarray,
    labels: np.ndarray,
    fit: Callable[[np.ndarray, np.ndarray], Callable[[np.ndarray], np.ndarray]],
    *,
    folds: int = 5,
    min_train_per_class: int = 1,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    what: str = "the fit",
) -> Separation:
    """Stratified ``folds``-fold cross-validation of ``fit`` (training rows and labels -> a
    scorer of feature rows, higher = member) on the supervised features ``z``: each text is
    scored by the fit of the folds that did not contain it; the pooled out-of-fold scores give
    the AUC and a stratified percentile bootstrap interval (:func:`calibdcd.metrics.
    bootstrap_ci`, as the distribution check's). Fewer folds when a training part would fall
    below ``min_train_per_class`` texts of a class (a classifier's own minimum); none possible,
    or a fold whose fit fails: ``skipped`` says why, and nothing is warned."""
    from sklearn.model_selection import StratifiedKFold

    from calibdcd.metrics import auc, bootstrap_ci

    x = np.asarray(z, dtype=np.float64)
    y = np.asarray(labels).astype(int)
    counts = [int((y == 1).sum()), int((y == 0).sum())]
    method = (
        f"stratified k-fold cross-validation of {what} on the supervised texts' features; AUC "
        f"of the pooled out-of-fold scores, percentile bootstrap interval ({n_boot} stratified "
        "resamples)"
    )

    def skipped(reason: str, k: int = 0) -> Separation:
        return Separation(None, None, None, level, k, counts[0], counts[1], method, None, None,
                          reason)  # fmt: skip

    k = _folds_for(counts, folds, min_train_per_class)
    if k < 2:
        return skipped(
            f"{counts[0]} members and {counts[1]} non-members are too few for 2 folds that "
            f"each train on {min_train_per_class} text(s) of each class"
        )
    oof = np.full(y.size, np.nan)
    try:
        for tr, te in StratifiedKFold(k, shuffle=True, random_state=seed).split(x, y):
            oof[te] = np.asarray(fit(x[tr], y[tr])(x[te]), dtype=np.float64)
    except (ValueError, ArithmeticError, RuntimeError, np.linalg.LinAlgError) as exc:
        return skipped(f"a fold's fit failed: {' '.join(str(exc).split())}", k)
    ok = np.isfinite(oof)
    if len(set(y[ok].tolist())) < 2:
        return skipped("no finite out-of-fold score for one of the classes", k)
    iv = bootstrap_ci(y[ok], oof[ok], auc, n_boot=n_boot, level=level, seed=seed)
    beats = bool(iv.low > 0.5)
    n_m, n_n = int((y[ok] == 1).sum()), int((y[ok] == 0).sum())
    warning = None
    if not beats:
        said = (
            f"the detector does not separate the known members from the known non-members it "
            f"did not train on: {k}-fold cross-validated AUC {iv.estimate:.3f} "
            f"[{iv.low:.3f}, {iv.high:.3f}] over {n_m} members and {n_n} non-members, an "
            "interval that does not exclude chance (0.5)"
        )
        if iv.high < 0.5:
            said += (
                "; it ranks the known members BELOW the non-members (its features point the "
                "other way for this target and these texts)"
            )
        warning = (
            said + ". Scores from this bundle can hardly tell members from non-members in a "
            "suspect set either; check that the members were truly in the target's training "
            "data and the non-members come from the same distribution, or try another detector."
        )
    return Separation(
        auc=float(iv.estimate), low=float(iv.low), high=float(iv.high), level=level, folds=k,
        n_members=n_m, n_nonmembers=n_n, method=method, beats_chance=beats, warning=warning,
    )  # fmt: skip
