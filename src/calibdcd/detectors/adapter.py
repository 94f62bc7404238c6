"""The one place that dispatches on a detector's optional capabilities.

A detector is a :class:`~calibdcd.detectors.base.Detector`; some also train parts without labels
on the texts they score (:class:`~calibdcd.detectors.base.PoolTrained`, VeilProbe's mapping
models), train a reference model on texts passed with ``extract``
(:class:`~calibdcd.detectors.base.ReferenceTrained`, DPDLLM), keep per-step timings
(:class:`~calibdcd.detectors.base.Timed`), need a minimum of supervised texts
(:class:`~calibdcd.detectors.base.NeedsSupervised`) or known non-member texts before any
extraction (:class:`~calibdcd.detectors.base.NeedsNonMembers`, ReCaLL's prefix). The experiment
runner, its dry run and the fitted detector all go through :class:`DetectorAdapter`, so a
capability is handled the same way by each, and a new detector needs only its module and its
registration.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calibdcd.detectors.base import (
    Detector,
    Features,
    NeedsNonMembers,
    NeedsSupervised,
    PoolTrained,
    ReferenceTrained,
    Timed,
)

__all__ = ["DetectorAdapter"]


class DetectorAdapter:
    """``detector`` seen through its capabilities (see the module doc)."""

    def __init__(self, detector: Detector) -> None:
        self.detector = detector
        self.pool_trained = isinstance(detector, PoolTrained)
        self.takes_reference = isinstance(detector, ReferenceTrained)
        self.takes_nonmembers = isinstance(detector, NeedsNonMembers)
        self._prepared_on: tuple[int, int] | None = None

    @property
    def min_supervised_per_class(self) -> int:
        """Supervised texts per class its classifier needs (1 when it states none)."""
        d = self.detector
        return int(d.min_supervised_per_class) if isinstance(d, NeedsSupervised) else 1

    def timings(self) -> dict[str, float]:
        """A copy of its per-step seconds so far ({} for a detector that keeps none)."""
        d = self.detector
        return {str(k): float(v) for k, v in d.timings.items()} if isinstance(d, Timed) else {}

    def reference_texts(self, texts: Sequence[str], pool: Sequence[str]) -> list[str] | None:
        """The texts its reference model trains on when ``texts`` (a part of ``pool``) are
        extracted; None for a detector without one."""
        if not self.takes_reference:
            return None
        return self.detector.reference_texts_for(list(texts), list(pool))  # type: ignore[attr-defined]

    def use_nonmembers(self, texts: Sequence[str]) -> None:
        """Hand it the known non-member texts its features need (before any ``extract``; the
        caller passes labelled non-members that are never evaluated); a no-op for a detector
        that takes none."""
        if self.takes_nonmembers:
            self.detector.use_nonmembers(list(texts))  # type: ignore[attr-defined]

    def prepare(self, pool: Sequence[str], target: Any) -> None:
        """Train its pool-learnt parts on ``pool`` for ``target`` (once per pool and target; a
        no-op for a detector without them)."""
        if not self.pool_trained:
            return
        key = (id(target), hash(tuple(pool)))
        if self._prepared_on == key:
            return
        self.detector.prepare(list(pool), target)  # type: ignore[attr-defined]
        self._prepared_on = key

    def extract(
        self,
        texts: Sequence[str],
        target: Any,
        view: Any | None = None,
        reference: Sequence[str] | None = None,
    ) -> Features:
        """Its features of ``texts`` (with ``reference``, the reference model's training texts,
        for a detector that takes them)."""
        if self.takes_reference:
            return self.detector.extract(  # type: ignore[call-arg]
                list(texts), target, view=view, reference_texts=list(reference or [])
            )
        return self.detector.extract(list(texts), target, view=view)

    def learnt_parts(self, target: Any, pool: Sequence[str]) -> dict[str, Path]:
        """The directories of what it learnt without labels ({} when nothing)."""
        if self.pool_trained:
            return self.detector.learnt_parts(target)  # type: ignore[attr-defined]
        if self.takes_reference:
            return self.detector.learnt_parts(list(pool))  # type: ignore[attr-defined]
        return {}

    def restore_parts(self, parts: dict[str, Path], pool: Sequence[str], target: Any) -> None:
        """Use saved learnt parts as if they had been trained on ``pool`` (for ``target``)."""
        if self.pool_trained:
            self.detector.restore_parts(parts, list(pool), target)  # type: ignore[attr-defined]
            self._prepared_on = (id(target), hash(tuple(pool)))
        elif self.takes_reference:
            self.detector.restore_parts(parts, list(pool))  # type: ignore[attr-defined]
