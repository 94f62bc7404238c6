"""The detector contract shared by VeilProbe, DPDLLM and the experiment runner.

A detector owns its original query construction e0, its generation parameters, its feature
extractor phi (with named feature blocks) and its classifier family. CalibDCD only sees arrays
and a score function, so the runner glues them as::

    feats = det.extract(texts, target)                 # original query e0
    feats_v = det.extract(texts, target, view=view)    # the same texts under a controlled view
    clf = det.new_classifier(seed).fit(z_train, y_train)
    block = feats.columns(det.calibration_blocks)
    cal = calibrate(z0, {view.code: z_view, ...}, clf.score, block=block)
    clf2 = det.new_classifier(seed).fit(cal.transform(z_train), y_train)

Views (``calibdcd.views.View``) wrap the detector's e0 query; only the query changes, never the
text that the features are computed against.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Classifier", "Detector", "Features"]


@dataclasses.dataclass(frozen=True)
class Features:
    """An (n, d) feature matrix with named, contiguous column blocks covering all d columns."""

    values: np.ndarray
    blocks: Mapping[str, slice]

    def __post_init__(self) -> None:
        v = np.asarray(self.values)
        if v.ndim != 2:
            raise ValueError(f"feature values must be 2-D (n, d), got shape {v.shape}")
        d = v.shape[1]
        covered = np.zeros(d, dtype=int)
        for name, sl in self.blocks.items():
            start, stop, step = sl.indices(d)
            if step != 1 or sl.start is None or sl.stop is None or sl.stop > d or start >= stop:
                raise ValueError(
                    f"feature block {name!r} = {sl} is not a non-empty range in [0, {d})"
                )
            covered[start:stop] += 1
        if self.blocks and not np.all(covered == 1):
            raise ValueError("feature blocks must partition the columns exactly once")

    @property
    def n(self) -> int:
        return int(self.values.shape[0])

    @property
    def dim(self) -> int:
        return int(self.values.shape[1])

    def columns(self, names: Sequence[str] | None) -> np.ndarray | None:
        """Sorted column indices of the named blocks; None (= all columns) for ``names=None``."""
        if names is None:
            return None
        idx: list[int] = []
        for name in names:
            if name not in self.blocks:
                raise KeyError(f"no feature block {name!r}; blocks: {', '.join(self.blocks)}")
            sl = self.blocks[name]
            idx.extend(range(sl.start, sl.stop))
        return np.array(sorted(idx), dtype=np.intp)


@runtime_checkable
class Classifier(Protocol):
    """A detector's classifier family. ``score`` is continuous, higher = member."""

    def fit(self, z: np.ndarray, labels: np.ndarray) -> Classifier: ...

    def score(self, z: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class Detector(Protocol):
    name: str
    #: names of the feature blocks CalibDCD may correct; None = the whole vector
    calibration_blocks: tuple[str, ...] | None

    def query(self, text: str) -> str:
        """The original query e0(s) sent to the target."""
        ...

    def extract(self, texts: Sequence[str], target: Any, view: Any | None = None) -> Features:
        """Features phi(e(s), target(e(s))) for each text, e = view wrapping e0 (None = e0)."""
        ...

    def new_classifier(self, seed: int = 0) -> Classifier: ...
