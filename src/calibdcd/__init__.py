"""calibdcd: black-box pre-training data contamination detection with CalibDCD calibration."""

from calibdcd.calibration import Calibration, CalibrationConfig, calibrate
from calibdcd.fitted import FittedDetector, FitTexts, TargetMismatchError, fit_detector

__all__ = [
    "Calibration",
    "CalibrationConfig",
    "FitTexts",
    "FittedDetector",
    "TargetMismatchError",
    "__version__",
    "calibrate",
    "fit_detector",
]
__version__ = "0.1.0"
