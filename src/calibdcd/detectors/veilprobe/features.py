"""VeilProbe's membership feature z = [E_s | D_s | dE | dD] and its supervised preprocessing.

* ``E_s``: pooled mapping-model encoder states of the text (input block; views never change it);
* ``D_s``: pooled decoder states, teacher-forced on the target's suffixes (output-derived block);
* ``dE = |E_r - E_s|``, ``dD = |D_r - D_s|``: the absolute change under key-token perturbation r.

``OUTPUT_BLOCKS = ("D", "dD")`` is what CalibDCD may correct. The official code's layout
``[f(s) ; prune(|f(r) - f(s)|)]`` with ``f = [enc | dec]`` is the same vector in this order.

:class:`Preprocessor` is fitted on the supervised split only: Welch t-test pruning of the delta
columns (p >= prune_p set to 0 in every row, as official; no columns are removed, so block indices
stay valid), then z-score normalisation (std floored; constant columns stay 0).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..base import Features

__all__ = ["BLOCKS", "OUTPUT_BLOCKS", "Preprocessor", "block_slices", "compose", "welch_keep"]

BLOCKS = ("E", "D", "dE", "dD")
OUTPUT_BLOCKS = ("D", "dD")
DELTA_BLOCKS = ("dE", "dD")


def block_slices(width: int) -> dict[str, slice]:
    """Column ranges of the four blocks for a pooled block width ``width``."""
    return {name: slice(i * width, (i + 1) * width) for i, name in enumerate(BLOCKS)}


def compose(E_s: np.ndarray, D_s: np.ndarray, E_r: np.ndarray, D_r: np.ndarray) -> Features:
    width = E_s.shape[1]
    for name, a in (("D_s", D_s), ("E_r", E_r), ("D_r", D_r)):
        if a.shape != E_s.shape:
            raise ValueError(f"{name} has shape {a.shape}, expected {E_s.shape}")
    z = np.concatenate([E_s, D_s, np.abs(E_r - E_s), np.abs(D_r - D_s)], axis=1)
    return Features(z.astype(np.float32), block_slices(width))


def welch_keep(x: np.ndarray, labels: np.ndarray, p_threshold: float) -> np.ndarray:
    """Boolean mask of columns whose Welch t-test (members vs non-members) has p < threshold.
    Columns with an undefined p value (constant within both classes) are not kept."""
    from scipy.stats import ttest_ind

    y = np.asarray(labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = ttest_ind(x[y == 1], x[y == 0], axis=0, equal_var=False).pvalue
    return np.nan_to_num(p, nan=1.0) < p_threshold


class Preprocessor:
    """Supervised-split pruning + z-score, as a fit/transform object over full z vectors."""

    def __init__(
        self,
        prune_columns: Sequence[int] | np.ndarray | None,
        *,
        prune_p: float = 0.01,
        normalize: bool = True,
        eps: float = 1e-8,
    ):
        self.prune_columns = None if prune_columns is None else np.asarray(prune_columns, int)
        self.prune_p = prune_p
        self.normalize = normalize
        self.eps = eps
        self.zeroed_: np.ndarray | None = None
        self.mean_: np.ndarray | None = None
        self.std_: np.ndarray | None = None

    def fit(self, z: np.ndarray, labels: np.ndarray) -> Preprocessor:
        z = np.asarray(z, dtype=np.float64)
        y = np.asarray(labels)
        if z.ndim != 2 or z.shape[0] != y.shape[0]:
            raise ValueError(f"z {z.shape} and labels {y.shape} do not match")
        if set(np.unique(y).tolist()) != {0, 1}:
            raise ValueError("labels must contain both classes 0 and 1")
        if self.prune_columns is not None and self.prune_columns.size:
            keep = welch_keep(z[:, self.prune_columns], y, self.prune_p)
            self.zeroed_ = self.prune_columns[~keep]
        else:
            self.zeroed_ = np.zeros(0, dtype=int)
        zp = self._prune(z)
        if self.normalize:
            self.mean_ = zp.mean(axis=0)
            std = zp.std(axis=0)
            self.std_ = np.where(std > self.eps, std, 1.0)
            self.mean_[std <= self.eps] = zp[0, std <= self.eps]  # constant columns -> 0
        return self

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays + JSON-able meta of the fitted preprocessor (see ``from_state``)."""
        if self.zeroed_ is None:
            raise RuntimeError("Preprocessor.state called before fit")
        arrays = {"zeroed": self.zeroed_}
        if self.prune_columns is not None:
            arrays["prune_columns"] = self.prune_columns
        if self.normalize:
            assert self.mean_ is not None and self.std_ is not None
            arrays.update(mean=self.mean_, std=self.std_)
        return arrays, {"prune_p": self.prune_p, "normalize": self.normalize, "eps": self.eps}

    @classmethod
    def from_state(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> Preprocessor:
        pre = cls(
            arrays.get("prune_columns"),
            prune_p=float(meta["prune_p"]),
            normalize=bool(meta["normalize"]),
            eps=float(meta["eps"]),
        )
        pre.zeroed_ = np.asarray(arrays["zeroed"], dtype=int)
        if pre.normalize:
            pre.mean_ = np.asarray(arrays["mean"], dtype=np.float64)
            pre.std_ = np.asarray(arrays["std"], dtype=np.float64)
        return pre

    def _prune(self, z: np.ndarray) -> np.ndarray:
        z = np.array(z, dtype=np.float64, copy=True)
        z[:, self.zeroed_] = 0.0
        return z

    def transform(self, z: np.ndarray) -> np.ndarray:
        if self.zeroed_ is None:
            raise RuntimeError("Preprocessor.transform called before fit")
        zp = self._prune(np.asarray(z))
        if self.normalize:
            zp = (zp - self.mean_) / self.std_
        return zp.astype(np.float32)
