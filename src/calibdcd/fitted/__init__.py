"""Fitted, persistable detectors: fit once on known members and non-members, save, score later.

See :mod:`calibdcd.fitted.detector` (the object and its bundle), :mod:`calibdcd.fitted.audit`
(p-values, set-level test, distribution check) and :mod:`calibdcd.fitted.calibrated` (the
calibrated classifier shared with the experiment runner).
"""

from calibdcd.fitted.calibrated import CalibratedClassifier, fit_calibrated
from calibdcd.fitted.detector import (
    FORMAT_VERSION,
    FittedDetector,
    FitTexts,
    ScoreResult,
    TargetMismatchError,
    fit_detector,
)
from calibdcd.targets.identity import target_record

__all__ = [
    "FORMAT_VERSION",
    "CalibratedClassifier",
    "FitTexts",
    "FittedDetector",
    "ScoreResult",
    "TargetMismatchError",
    "fit_calibrated",
    "fit_detector",
    "target_record",
]
