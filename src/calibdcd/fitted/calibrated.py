"""A detector's classifier with CalibDCD applied: the one scoring path of the experiment runner
and of :class:`calibdcd.fitted.FittedDetector`.

:func:`fit_calibrated` is the paper's pipeline after feature extraction: the original classifier
on the supervised split, CalibDCD on the calibration non-members (the original score fixed), the
selected correction applied to the supervised features and a fresh classifier of the family
retrained on them. :class:`CalibratedClassifier` scores raw features with the result.

``space`` is where CalibDCD works: ``"raw"`` (the extractor's output, scored by the
classifier's ``score``) or ``"normalized"`` (the classifier's own normalised space,
:class:`~calibdcd.detectors.base.NormalizedClassifier`: its ``transform`` then
``score_transformed``). In the normalised space the retrained classifier is fitted on the
corrected normalised features (its own normalisation is refitted on top). When CalibDCD selects
no correction the calibrated classifier *is* the original one (identical scores).

:func:`calibration_state` / :func:`calibration_from_state` store a :class:`Calibration` in full
(basis, centre, block, every diagnostic) as arrays + JSON, no pickle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

from calibdcd.calibration import Calibration, CalibrationConfig, ViewShift, calibrate
from calibdcd.detectors.base import NormalizedClassifier

__all__ = [
    "CalibratedClassifier",
    "Space",
    "calibration_from_state",
    "calibration_state",
    "fit_calibrated",
    "has_normalized_space",
    "resolve_space",
]

Space = Literal["raw", "normalized"]


def has_normalized_space(clf: Any) -> bool:
    """Whether the classifier declares a normalised space (NormalizedClassifier)."""
    return isinstance(clf, NormalizedClassifier)


def resolve_space(clf: Any, requested: str) -> Space:
    """``auto`` -> normalized when the classifier exposes its space, else raw."""
    has = has_normalized_space(clf)
    if requested == "normalized" and not has:
        raise ValueError(
            "calibration_space: normalized needs a classifier with transform() and "
            f"score_transformed(); {type(clf).__name__} has no such space"
        )
    if requested == "raw":
        return "raw"
    return "normalized" if has else "raw"


@dataclasses.dataclass
class CalibratedClassifier:
    """The original classifier, CalibDCD's correction and the retrained classifier.

    ``calibration`` None (CalibDCD not applied) or not ``corrected`` (no correction selected):
    scores are the original classifier's.
    """

    original: Any
    calibration: Calibration | None = None
    retrained: Any | None = None
    space: Space = "raw"

    @property
    def corrected(self) -> bool:
        return self.calibration is not None and self.calibration.corrected

    def forward(self, z: np.ndarray) -> np.ndarray:
        """Raw features in CalibDCD's space."""
        if self.space == "normalized":
            return np.asarray(self.original.transform(z), dtype=np.float64)
        return np.asarray(z, dtype=np.float64)

    def score0(self, zt: np.ndarray) -> np.ndarray:
        """The original (fixed) score q on features already in CalibDCD's space."""
        if self.space == "normalized":
            return np.asarray(self.original.score_transformed(zt), dtype=np.float64)
        return np.asarray(self.original.score(zt), dtype=np.float64)

    def corrected_features(self, z: np.ndarray) -> np.ndarray:
        """Raw features corrected by the calibration, in the space the retrained classifier is
        fitted on."""
        assert self.calibration is not None
        return self.calibration.transform(self.forward(z))

    def score_original(self, z: np.ndarray) -> np.ndarray:
        return np.asarray(self.original.score(z), dtype=np.float64)

    def score(self, z: np.ndarray) -> np.ndarray:
        """Scores of raw features (higher = member)."""
        if not self.corrected:
            return self.score_original(z)
        assert self.retrained is not None
        return np.asarray(self.retrained.score(self.corrected_features(z)), dtype=np.float64)


def calibrate_classifier(
    original: Any,
    z_cal: np.ndarray,
    views: Mapping[str, np.ndarray],
    config: CalibrationConfig,
    *,
    block: np.ndarray | None = None,
    space: Space = "raw",
) -> Calibration:
    """CalibDCD on the calibration non-members' raw features with ``original``'s score fixed."""
    probe = CalibratedClassifier(original, space=space)
    return calibrate(
        probe.forward(z_cal),
        {k: probe.forward(v) for k, v in views.items()},
        probe.score0,
        block=block,
        **config.kwargs(),
    )


def retrain(
    original: Any,
    cal: Calibration,
    z_sup: np.ndarray,
    y_sup: np.ndarray,
    new_classifier: Callable[[], Any],
    *,
    space: Space = "raw",
) -> CalibratedClassifier:
    """The classifier family refitted on the corrected supervised features (none when the
    calibration selected no correction)."""
    out = CalibratedClassifier(original, cal, None, space)
    if out.corrected:
        out.retrained = new_classifier().fit(out.corrected_features(z_sup), y_sup)
    return out


def fit_calibrated(
    z_sup: np.ndarray,
    y_sup: np.ndarray,
    new_classifier: Callable[[], Any],
    *,
    z_cal: np.ndarray | None = None,
    views: Mapping[str, np.ndarray] | None = None,
    config: CalibrationConfig | None = None,
    block: np.ndarray | None = None,
    space: str = "raw",
) -> CalibratedClassifier:
    """Original classifier + (when ``config`` is given) CalibDCD and the retrained classifier."""
    original = new_classifier().fit(z_sup, y_sup)
    sp = resolve_space(original, space)
    if config is None:
        return CalibratedClassifier(original, None, None, sp)
    if z_cal is None or not views:
        raise ValueError("CalibDCD needs calibration non-members' features under e0 and views")
    cal = calibrate_classifier(original, z_cal, views, config, block=block, space=sp)
    return retrain(original, cal, z_sup, y_sup, new_classifier, space=sp)


# --------------------------------------------------------------------------------------------
# Persistence of a Calibration (arrays + JSON)
# --------------------------------------------------------------------------------------------


def calibration_state(cal: Calibration) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every field of ``cal`` as arrays and JSON-able meta (:func:`calibration_from_state`)."""
    arrays: dict[str, np.ndarray] = {
        "basis": np.asarray(cal.basis, dtype=np.float64),
        "block": np.asarray(cal.block, dtype=np.int64),
    }
    if cal.center is not None:
        arrays["center"] = np.asarray(cal.center, dtype=np.float64)
    for r, gam in cal.consensus.items():
        arrays[f"consensus.{int(r)}"] = np.asarray(gam, dtype=np.float64)
    for i, s in enumerate(cal.shifts):
        arrays[f"shift.{i}.singular_values"] = np.asarray(s.singular_values, dtype=np.float64)
    meta = {
        "fpp": {k: float(v) for k, v in cal.fpp.items()},
        "selected_views": list(cal.selected_views),
        "shifts": [{"name": s.name, "n_positive": s.n_positive, "cap": s.cap} for s in cal.shifts],
        "consensus_ranks": [int(r) for r in cal.consensus],
        "basis_dims": {str(r): int(k) for r, k in cal.basis_dims.items()},
        "objective": [[int(r), float(lam), float(j)] for (r, lam), j in cal.objective.items()],
        "rank": cal.rank,
        "strength": float(cal.strength),
        "dim": int(cal.dim),
        "config": cal.config.kwargs(),
        "baseline_score": float(cal.baseline_score),
    }
    return arrays, meta


def calibration_from_state(
    arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]
) -> Calibration:
    cfg = dict(meta["config"])
    return Calibration(
        fpp={k: float(v) for k, v in meta["fpp"].items()},
        selected_views=tuple(meta["selected_views"]),
        shifts=tuple(
            ViewShift(
                s["name"],
                int(s["n_positive"]),
                float(s["cap"]),
                np.asarray(arrays[f"shift.{i}.singular_values"]),
            )
            for i, s in enumerate(meta["shifts"])
        ),
        consensus={
            int(r): np.asarray(arrays[f"consensus.{int(r)}"]) for r in meta["consensus_ranks"]
        },
        basis_dims={int(r): int(k) for r, k in meta["basis_dims"].items()},
        objective={(int(r), float(lam)): float(j) for r, lam, j in meta["objective"]},
        rank=None if meta["rank"] is None else int(meta["rank"]),
        strength=float(meta["strength"]),
        basis=np.asarray(arrays["basis"], dtype=np.float64),
        block=np.asarray(arrays["block"], dtype=np.intp),
        dim=int(meta["dim"]),
        config=CalibrationConfig(**cfg),
        baseline_score=float(meta["baseline_score"]),
        center=np.asarray(arrays["center"]) if "center" in arrays else None,
    )
