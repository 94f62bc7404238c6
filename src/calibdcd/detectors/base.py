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

Capabilities beyond :class:`Detector` are declared, not discovered: a detector class subclasses
the protocols it implements, and the runner and :mod:`calibdcd.fitted` test ``isinstance``:

* :class:`PoolTrained`: learnt parts trained without labels on the candidate texts it scores,
  through ``prepare(pool, target)`` (VeilProbe's mapping model);
* :class:`ReferenceTrained`: a reference model trained without labels on texts passed with every
  ``extract`` call (``reference_texts``; DPDLLM's reference LM, ``reference_texts_for`` says which
  texts a split gets under its ``reference.arrangement``);
* :class:`NeedsNonMembers`: features that need known non-member texts, handed once before any
  ``extract`` (``use_nonmembers``; ReCaLL's prefix): the supervised split's non-members, never
  an evaluation text;
* :class:`Timed`: per-step wall seconds kept on the detector (``timings``);
* :class:`NormalizedClassifier`: a classifier with its own normalised space (``transform``, a
  score on transformed features ``score_transformed``, optionally ``inverse_transform``), in
  which CalibDCD can calibrate (``calibration_space: normalized``);
* :class:`PersistableClassifier`: ``state()`` / ``from_state()`` (arrays + JSON, no pickle).

Both kinds of learnt parts also save and restore their trained state
(``learnt_parts`` / ``restore_parts``: directories of safetensors + JSON), which is how a
:class:`calibdcd.fitted.FittedDetector` bundle carries them to another machine.

Detectors are built by name through :func:`register_detector` / :func:`create_detector`, like
targets' ``register_backend``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from calibdcd.targets.base import GenerationParams

__all__ = [
    "Classifier",
    "Detector",
    "Features",
    "NeedsNonMembers",
    "NeedsSupervised",
    "NormalizedClassifier",
    "PersistableClassifier",
    "PoolTrained",
    "ReferenceTrained",
    "Timed",
    "block_columns",
    "completions_per_text",
    "decoding_record",
]


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
        return block_columns(self.blocks, names)


def block_columns(
    blocks: Mapping[str, slice] | None, names: Sequence[str] | None
) -> np.ndarray | None:
    """Sorted column indices of the named feature blocks (None = all columns for
    ``names=None``); a KeyError names a block that is not there."""
    if names is None:
        return None
    if blocks is None:
        raise KeyError("the detector's features have no named blocks")
    idx: list[int] = []
    for name in names:
        if name not in blocks:
            raise KeyError(f"no feature block {name!r}; blocks: {', '.join(blocks)}")
        idx.extend(range(blocks[name].start, blocks[name].stop))
    return np.array(sorted(idx), dtype=np.intp)


@runtime_checkable
class Classifier(Protocol):
    """A detector's classifier family. ``score`` is continuous, higher = member."""

    def fit(self, z: np.ndarray, labels: np.ndarray) -> Classifier: ...

    def score(self, z: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class Detector(Protocol):
    """What every detector is (``tests/test_detector_contract.py`` checks each registered one).

    ``config``: its parameters, a dataclass, set at construction and never changed by fitting
    (as scikit-learn's ``get_params``): the feature cache's key is its fingerprint, so every
    option that changes a feature must be in it. ``cache_version``: bumped when the recipe of
    its cached artefacts changes without an option changing (None: never). ``generation_kinds``:
    the decoding of each kind of target query it sends (a run records what the target used).
    The optional capabilities (:class:`PoolTrained`, :class:`ReferenceTrained`,
    :class:`Timed`, :class:`NeedsSupervised`, :class:`NeedsNonMembers`) are dispatched in one
    place, :class:`calibdcd.detectors.adapter.DetectorAdapter`."""

    name: str
    #: names of the feature blocks CalibDCD may correct; None = the whole vector
    calibration_blocks: tuple[str, ...] | None
    config: Any
    cache_version: int | str | None

    @property
    def generation_kinds(self) -> Mapping[str, GenerationParams]: ...

    def query(self, text: str) -> str:
        """The original query e0(s) sent to the target."""
        ...

    def extract(self, texts: Sequence[str], target: Any, view: Any | None = None) -> Features:
        """Features phi(e(s), target(e(s))) for each text, e = view wrapping e0 (None = e0)."""
        ...

    def new_classifier(self, seed: int = 0) -> Classifier: ...


@runtime_checkable
class NormalizedClassifier(Classifier, Protocol):
    """A classifier that normalises its input first and exposes that space:
    ``score(z) == score_transformed(transform(z))``."""

    def transform(self, z: np.ndarray) -> np.ndarray: ...

    def score_transformed(self, zt: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class PersistableClassifier(Classifier, Protocol):
    """A classifier whose fitted state is arrays + JSON-able meta (no pickle)."""

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]: ...

    @classmethod
    def from_state(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> Any: ...


@runtime_checkable
class NeedsSupervised(Protocol):
    """A detector whose classifier needs at least ``min_supervised_per_class`` supervised texts
    per class (VeilProbe's episodes: support + query). The dry run checks the split against it,
    so a run does not fail on it after its generations."""

    @property
    def min_supervised_per_class(self) -> int: ...


@runtime_checkable
class NeedsNonMembers(Protocol):
    """A detector whose features need known non-member texts (ReCaLL's prefix of non-member
    context). ``use_nonmembers(texts)`` hands them before any ``extract``; every later
    ``extract`` uses what they made, so they are part of what the features depend on (the
    feature cache's key). The caller passes labelled non-members that are never scored for
    evaluation: the supervised split's (an experiment) or the fit's supervised ones (a fitted
    detector, from its bundle's texts)."""

    def use_nonmembers(self, texts: list[str]) -> None: ...


@runtime_checkable
class Timed(Protocol):
    """A detector that accumulates wall seconds per step of its own (``timings``)."""

    timings: Mapping[str, float]


@runtime_checkable
class PoolTrained(Protocol):
    """A detector with parts learnt, without labels, on the candidate texts it scores.

    ``prepare(pool, target)`` trains them on ``pool`` (every later ``extract`` uses them);
    ``learnt_parts(target)`` names the directories of the trained state for ``target``
    (safetensors + JSON); ``restore_parts(parts, pool, target)`` makes the detector use those
    directories as if ``prepare(pool, target)`` had trained them.
    """

    def prepare(self, pool: Sequence[str], target: Any) -> Any: ...

    def learnt_parts(self, target: Any) -> dict[str, Path]: ...

    def restore_parts(
        self, parts: Mapping[str, Path], pool: Sequence[str], target: Any
    ) -> None: ...


@runtime_checkable
class ReferenceTrained(Protocol):
    """A detector whose features come from a reference model trained, without labels, on
    ``reference_texts`` passed with ``extract``.

    ``reference_texts_for(split_texts, all_texts)`` is the set a split gets (e.g. every
    candidate text when shared); ``learnt_parts(reference_texts)`` the directory of the trained
    reference (safetensors + JSON); ``restore_parts(parts, reference_texts)`` uses a saved one
    for those texts instead of training it.
    """

    def extract(
        self,
        texts: Sequence[str],
        target: Any,
        view: Any | None = None,
        reference_texts: Sequence[str] | None = None,
    ) -> Features: ...

    def reference_texts_for(
        self, split_texts: Sequence[str], all_texts: Sequence[str]
    ) -> list[str]: ...

    def learnt_parts(self, reference_texts: Sequence[str]) -> dict[str, Path]: ...

    def restore_parts(self, parts: Mapping[str, Path], reference_texts: Sequence[str]) -> None: ...


def decoding_record(detector: Any, target: Any, features: Any = None) -> dict[str, Any]:
    """What ``target`` decoded each kind of ``detector``'s queries with, for a run directory or a
    fitted bundle: the features' own ``generation`` when they carry one (DPDLLM), otherwise the
    target's :func:`~calibdcd.targets.base.generation_record` of every entry of the detector's
    ``generation_kinds`` (VeilProbe, Overlap); ``{}`` for a detector that names neither."""
    from calibdcd.targets.base import generation_record

    own = dict(getattr(features, "generation", None) or {})
    if own:
        return own
    return {str(k): generation_record(target, p) for k, p in detector.generation_kinds.items()}


def completions_per_text(detector: Any) -> tuple[int, str] | None:
    """(completions a target generates per text for ``detector``, how that count arises) from
    its ``generation_kinds`` (greedy decoding: one, whatever ``n``; sampled: ``n``) times its
    ``queries_per_text`` (VeilProbe: the text and its perturbation); None when it states none.
    What a dry run's estimate of the target's work multiplies by the texts."""
    kinds = dict(getattr(detector, "generation_kinds", None) or {})
    if not kinds:
        return None
    queries = int(getattr(detector, "queries_per_text", 1))
    per_query = sum(1 if p.greedy else int(p.n) for p in kinds.values())
    how = ", ".join(
        f"{k}: {'1 greedy' if p.greedy else f'{p.n} sampled'}" for k, p in kinds.items()
    )
    if queries > 1:
        how += f", for each of {queries} queries per text"
    return per_query * queries, how
