"""The field's standard membership-inference attacks as calibdcd detectors (issue 49).

Gray-box (the target's :class:`~calibdcd.targets.logprobs.TokenLogprobs`): LOSS (``loss.py``),
zlib (``zlib_ratio.py``), Min-K% (``mink.py``), Min-K%++ (``minkpp.py``), ReCaLL (``recall.py``:
its prefix from known non-members, handed through the detector adapter);
black-box: SaMIA (``samia.py``, the sampled mode of the overlap baseline). Each is score-only:
its features are one column, the attack's statistic signed so that higher = member, and its
classifier (:class:`~calibdcd.detectors.attacks.common.ScoreClassifier`) learns nothing, so
CalibDCD, the reports, the controls and ``calibdcd fit``/``score`` treat it like any detector.

Beyond them, ours: the log-probability profile (``profile.py``, registered ``logprofile``), a
feature-based gray-box detector (Min-K% at several k, moments, zlib, per-segment means; logistic
regression) whose features CalibDCD can calibrate.
"""

from calibdcd.detectors.attacks.common import AttackConfig, LogprobAttack, ScoreClassifier

__all__ = ["AttackConfig", "LogprobAttack", "ScoreClassifier"]
