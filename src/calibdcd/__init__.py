"""calibdcd: black-box pre-training data contamination detection with CalibDCD calibration."""

__version__ = "0.1.0"
