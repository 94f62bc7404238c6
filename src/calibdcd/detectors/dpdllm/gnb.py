"""Gaussian Naive Bayes, fitted by scikit-learn, scored by its log-odds.

DPDLLM's official classifier is scikit-learn's ``GaussianNB()`` with default settings; this
class fits exactly that model (``sklearn.naive_bayes.GaussianNB``: its variance smoothing, its
empirical class priors) and keeps what it learnt as arrays (``state``/``from_state``: no
pickle). The score is the difference of the two classes' joint log-likelihoods,
``log p(z | 1) + log pi_1 - log p(z | 0) - log pi_0``: a continuous log-odds, higher = member,
computed from the stored arrays with scikit-learn's own formula (tested equal to its
``predict_joint_log_proba``) so that a restored bundle scores without rebuilding a scikit-learn
object. The official script's hard-label AUC (``roc_auc_score(y, clf.predict(X))``) equals
balanced accuracy and is not used; ``predict_proba`` is not used either because it saturates at
0/1 on 64-256-dimensional inputs and makes TPR@5%FPR meaningless.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from calibdcd.detectors.base import PersistableClassifier

__all__ = ["GaussianNB", "gnb_joint_log_likelihood"]


def _check_matrix(z: np.ndarray, name: str, d: int | None = None) -> np.ndarray:
    arr = np.asarray(z, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (n, d) array, got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} has no rows")
    if d is not None and arr.shape[1] != d:
        raise ValueError(f"{name} has {arr.shape[1]} columns, the classifier was fit on {d}")
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)[:5].tolist()
        raise ValueError(
            f"{name} has non-finite values in {int(bad.sum())} row(s), e.g. rows {rows} "
            "(drop the gaps recorded in the features' `valid` mask first)"
        )
    return arr


def gnb_joint_log_likelihood(
    z: np.ndarray, means: np.ndarray, variances: np.ndarray, log_priors: np.ndarray
) -> np.ndarray:
    """(n, k) joint log-likelihoods ``log pi_c + sum_j log N(z_j; mean_cj, var_cj)``."""
    z = np.asarray(z, dtype=np.float64)
    out = np.empty((z.shape[0], means.shape[0]))
    for c in range(means.shape[0]):
        norm = -0.5 * np.sum(np.log(2.0 * np.pi * variances[c]))
        quad = -0.5 * np.sum((z - means[c]) ** 2 / variances[c], axis=1)
        out[:, c] = log_priors[c] + norm + quad
    return out


@dataclasses.dataclass
class GaussianNB(PersistableClassifier):
    """Binary Gaussian Naive Bayes (labels 1 = member, 0 = non-member).

    ``var_smoothing`` adds ``var_smoothing * max_j var(z[:, j])`` (variance over all training rows)
    to every per-class variance, exactly as scikit-learn does. ``priors`` fixes (pi_0, pi_1);
    None = the empirical class frequencies.
    """

    var_smoothing: float = 1e-9
    priors: tuple[float, float] | None = None
    means_: np.ndarray | None = dataclasses.field(default=None, repr=False)
    variances_: np.ndarray | None = dataclasses.field(default=None, repr=False)
    log_priors_: np.ndarray | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not (self.var_smoothing >= 0.0):
            raise ValueError(f"var_smoothing must be >= 0, got {self.var_smoothing!r}")
        if self.priors is not None:
            p = np.asarray(self.priors, dtype=float)
            if p.shape != (2,) or np.any(p <= 0) or not np.isclose(p.sum(), 1.0):
                raise ValueError(
                    f"priors must be two positive numbers summing to 1, got {self.priors!r}"
                )

    @property
    def fitted(self) -> bool:
        return self.means_ is not None

    def fit(self, z: np.ndarray, labels: np.ndarray) -> GaussianNB:
        x = _check_matrix(z, "z")
        y = np.asarray(labels)
        if y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise ValueError(f"labels must be 1-D with {x.shape[0]} entries, got shape {y.shape}")
        if not np.isin(y, (0, 1)).all():
            raise ValueError("labels must be 0 (non-member) or 1 (member)")
        y = y.astype(int)
        counts = np.bincount(y, minlength=2)
        if np.any(counts == 0):
            raise ValueError(f"labels need both classes, got counts {counts.tolist()} for (0, 1)")
        from sklearn.naive_bayes import GaussianNB as SkGaussianNB

        sk = SkGaussianNB(
            var_smoothing=self.var_smoothing,
            priors=None if self.priors is None else list(self.priors),
        ).fit(x, y)
        if np.any(sk.var_ <= 0):
            raise ValueError(
                "a feature has zero variance within a class and var_smoothing gives no floor "
                "(all features constant?); increase var_smoothing"
            )
        self.means_ = np.asarray(sk.theta_, dtype=np.float64)
        self.variances_ = np.asarray(sk.var_, dtype=np.float64)
        self.log_priors_ = np.log(np.asarray(sk.class_prior_, dtype=np.float64))
        return self

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays + JSON-able meta of the fitted model (no pickle; see ``from_state``)."""
        self._require_fit()
        assert self.variances_ is not None and self.log_priors_ is not None
        arrays = {"means": self.means_, "variances": self.variances_}
        arrays["log_priors"] = self.log_priors_
        priors = None if self.priors is None else [float(x) for x in self.priors]
        return arrays, {"var_smoothing": self.var_smoothing, "priors": priors}

    @classmethod
    def from_state(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> GaussianNB:
        priors = meta.get("priors")
        m = cls(var_smoothing=float(meta["var_smoothing"]), priors=priors and tuple(priors))
        m.means_ = np.asarray(arrays["means"], dtype=np.float64)
        m.variances_ = np.asarray(arrays["variances"], dtype=np.float64)
        m.log_priors_ = np.asarray(arrays["log_priors"], dtype=np.float64)
        if not (m.means_.ndim == 2 and m.means_.shape == m.variances_.shape):
            raise ValueError(
                f"inconsistent GaussianNB state: {m.means_.shape} / {m.variances_.shape}"
            )
        return m

    def _require_fit(self) -> None:
        if self.means_ is None:
            raise ValueError("GaussianNB is not fitted: call fit(z, labels) first")

    def joint_log_likelihood(self, z: np.ndarray) -> np.ndarray:
        """(n, 2) joint log-likelihoods, column c = class c."""
        self._require_fit()
        assert self.means_ is not None and self.variances_ is not None
        assert self.log_priors_ is not None
        x = _check_matrix(z, "z", d=self.means_.shape[1])
        return gnb_joint_log_likelihood(x, self.means_, self.variances_, self.log_priors_)

    def score(self, z: np.ndarray) -> np.ndarray:
        """Continuous log-odds of membership (higher = member)."""
        jll = self.joint_log_likelihood(z)
        return jll[:, 1] - jll[:, 0]

    def predict_proba(self, z: np.ndarray) -> np.ndarray:
        """(n, 2) posteriors (they saturate on high-dimensional inputs; use ``score``)."""
        jll = self.joint_log_likelihood(z)
        jll = jll - jll.max(axis=1, keepdims=True)
        p = np.exp(jll)
        return p / p.sum(axis=1, keepdims=True)

    def predict(self, z: np.ndarray) -> np.ndarray:
        """Hard labels (ties go to class 0, as scikit-learn's argmax)."""
        return (self.score(z) > 0).astype(int)
