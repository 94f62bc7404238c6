"""calibdcd: black-box pre-training data contamination detection with CalibDCD calibration."""

from calibdcd.calibration import Calibration, CalibrationConfig, calibrate

__all__ = ["Calibration", "CalibrationConfig", "__version__", "calibrate"]
__version__ = "0.1.0"
