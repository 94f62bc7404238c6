"""CalibDCD in the loop for one setting, and the paper's per-setting analyses.

:class:`CalibrationProblem` holds one setting's features (supervised split, evaluation pool,
calibration non-members under e0 and under every view) and the original trained classifier.
``problem.run(config)`` is the paper's pipeline after feature extraction: calibrate on the
calibration non-members with the original score fixed, apply the selected correction, retrain the
classifier family on the corrected supervised features, score the pool. The analyses re-run it
with changed CalibDCD settings, all from the same arrays (no new target queries):

* ablations (paper Table "Ablation results"): ``random3`` (seeded random views), ``top1``,
  ``no_consensus``, ``binary`` weights, and ``fixed_full`` (λ = 1 at the selected r, only for
  settings whose selected λ < 1);
* ``fixed``: the fixed configuration (r = 3, λ = 0.9) against the adaptive choice;
* false-positive recovery (:func:`fp_recovery`);
* controls (:func:`controls`), each scored on the same pool so that it can be compared with the
  original detector exactly as CalibDCD is:

  - ``placebo``: a random orthonormal basis in the same correctable block with CalibDCD's chosen
    rank k (columns of B) and strength λ, applied in the same space and followed by the same
    retraining. When CalibDCD chose no correction, the size of the fixed configuration
    (r = 3, λ = 0.9 by default: its k, or r when it has no consensus direction) is used, and the
    summary says so (``size_from``). It separates "CalibDCD's directions" from "remove k
    directions and retrain".
  - ``noise_floor``: how much the detector's pool AUC and TPR move when nothing but its
    training sample changes (no correction; the classifier's seed is the setting's: a new seed
    alone changes nothing for a Gaussian NB). Two methods (``analyses.noise_floor``):

    - ``half_sample`` (default): an interval around the detector's own AUC (and TPR) whose width is
      the classifier's spread at the training set's size n (:func:`half_sample_floor`). The
      supervised set is split into two stratified halves without replacement (each class halved; an
      odd text left out of both), ``HALF_SAMPLE_SPLITS`` times, the classifier retrained on each
      half and scored on the pool. Half-sampling (the delete-d jackknife with d = n/2) is why
      halves: for a statistic that is a mean, a subsample of m of the n texts drawn without
      replacement has Var(θ_m − θ_n) = σ²(1/m − 1/n), so the deviations scaled by √(m/(n − m)) have
      the n-sample variance σ²/n, and at m = n/2 the factor is exactly 1
      (:func:`half_sample_spread`); the delete-d jackknife with d/n fixed is consistent for
      non-smooth statistics too (an AUC). Checked against a simulated n-sample spread
      (tests/test_noise_floor.py) and, on the micro lab's features, against the spread over many 50
      + 50 training sets drawn from held-out texts (2026-11-28: DPDLLM within about 20 % on three
      chat models, VeilProbe from 10 % wide to about 35 % narrow, so read it as approximate). The
      deviations are taken from the halves' own mean (their mean shift, the learning curve from n/2
      to n, is reported apart as ``auc_shift``): a floor centred on the smaller training set's mean
      is what made the bootstrap floor one-sided. The interval is the detector's value ± z·SD (z of
      ``level``); it says how far another training sample of the same size would plausibly move the
      detector, the yardstick for a CalibDCD or placebo change on the same pool. It has no per-text
      scores of its own (no ``score_noise_floor`` column, no paired comparison). Re-drawing the
      supervised split instead would change the evaluation pool with it (the texts leave and join
      the pool), so the spread would mix training and evaluation noise; halves keep the pool fixed.
    - ``bootstrap`` (the earlier control, kept as a named variant): the classifier retrained on
      one stratified bootstrap resample of the supervised set (:func:`bootstrap_floor`). A
      resample holds about 63 % unique texts, so it measures a smaller training set and reads
      lower than the detector (one-sided), not the classifier's spread at n.
  - ``centred`` (beyond the paper): CalibDCD with ``centering="nonmembers"``, the correction
    around the calibration non-members' mean instead of the feature origin.

  The variants beyond the paper (:data:`VARIANTS`: ``centred`` above, ``abstain``,
  ``normalized``) are CalibDCD with one setting changed, each with its own calibration, each
  reported as its own row beside the paper's method:

  - ``abstain``: no correction when the best J ≤ 0 (``guard=True``): the original detector is
    kept instead of the paper's argmax.
  - ``normalized``: the correction in the classifier's normalised space (after its own
    pruning/z-score), the retrained classifier refitting its normalisation on top; only for a
    classifier that exposes such a space (VeilProbe, overlap) and a setting that calibrates in
    the raw space.

Choices where the paper is silent (documented settings):

* **Feature space.** ``space="normalized"`` calibrates in the space the classifier consumes
  (after its own normalisation, e.g. VeilProbe's z-score) when the classifier declares one
  (:class:`calibdcd.detectors.base.NormalizedClassifier`: ``transform`` and
  ``score_transformed``; VeilProbe's classifier: its ProtoNet's score); ``"raw"`` calibrates the
  extractor's output with the classifier's full ``score``. Retraining fits a fresh classifier of
  the family on the corrected features; in the normalised space on the corrected normalised
  features (its own normalisation is then refitted on top). The scoring path is
  :class:`calibdcd.fitted.calibrated.CalibratedClassifier`, shared with the fitted detector.
* **No correction.** When CalibDCD selects no correction (the argmax is a rank whose consensus
  is empty, or, in the abstention variant, the best J ≤ 0), the calibrated detector *is* the
  original one: no retraining, identical scores.
* **Fixed configurations** (``fixed_full``, ``fixed``) are applied even when their J ≤ 0
  (``guard=False``): they measure what that configuration does, not whether it would be chosen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from calibdcd.calibration import Calibration, CalibrationConfig
from calibdcd.fitted.calibrated import (
    CalibratedClassifier,
    Space,
    calibrate_classifier,
    has_normalized_space,
    resolve_space,
)
from calibdcd.fitted.calibrated import retrain as retrain_classifier
from calibdcd.metrics import auc, roc_curve, tpr_at_fpr

__all__ = [
    "CONTROLS",
    "HALF_SAMPLE_SPLITS",
    "NOISE_FLOORS",
    "VARIANTS",
    "CalibrationProblem",
    "ControlOutcome",
    "Outcome",
    "ablation_configs",
    "bootstrap_floor",
    "controls",
    "fixed_config",
    "fp_recovery",
    "half_sample_floor",
    "half_sample_indices",
    "half_sample_spread",
    "other_space",
    "resolve_space",
    "threshold_at_fpr",
    "variant_configs",
]


def other_space(clf: Any, space: Space) -> Space | None:
    """The calibration space a setting did not use, when its classifier has both."""
    if not has_normalized_space(clf):
        return None
    return "raw" if space == "normalized" else "normalized"


@dataclasses.dataclass
class Outcome:
    """One calibrated detector: the calibration, the retrained classifier and pool scores."""

    calibration: Calibration
    scores: np.ndarray  #: calibrated detector's scores on the evaluation pool
    auc: float
    tpr: float
    classifier: Any

    def summary(self) -> dict[str, Any]:
        c = self.calibration
        return {
            "auc": self.auc,
            "tpr": self.tpr,
            "corrected": c.corrected,
            "rank": c.rank,
            "strength": c.strength,
            "basis_dim": int(c.basis.shape[1]),
            "selected_views": list(c.selected_views),
            "best_objective": c.best_objective,
        }


@dataclasses.dataclass
class CalibrationProblem:
    """One setting's arrays and original classifier (raw features = the extractor's output)."""

    z_sup: np.ndarray
    y_sup: np.ndarray
    z_eval: np.ndarray
    y_eval: np.ndarray
    z_cal: np.ndarray
    views: Mapping[str, np.ndarray]
    original: Any
    new_classifier: Callable[[], Any]
    block: np.ndarray | None = None
    space: Space = "raw"
    fpr: float = 0.05
    #: optional (key -> fitted classifier) cache hook: (key, build) -> classifier
    model_cache: Callable[[str, Calibration, Callable[[], Any]], Any] | None = None

    def __post_init__(self) -> None:
        self.scores_before = np.asarray(self.original.score(self.z_eval), dtype=np.float64)
        self.auc_before = auc(self.y_eval, self.scores_before)
        self.tpr_before = tpr_at_fpr(self.y_eval, self.scores_before, self.fpr)
        self._views_t = {k: self.forward(v) for k, v in self.views.items()}
        self._cal_t = self.forward(self.z_cal)

    # -- the feature space CalibDCD works in (calibdcd.fitted.calibrated) ---------------------
    def calibrated(self, cal: Calibration | None = None, clf: Any = None) -> CalibratedClassifier:
        """The calibrated detector of ``cal`` and its retrained classifier ``clf`` (the same
        object :class:`calibdcd.fitted.FittedDetector` scores with)."""
        retrained = None if clf is self.original else clf
        return CalibratedClassifier(self.original, cal, retrained, self.space)

    def forward(self, z: np.ndarray) -> np.ndarray:
        return self.calibrated().forward(z)

    def score0(self, zt: np.ndarray) -> np.ndarray:
        """The fixed original score q in the calibration space."""
        return self.calibrated().score0(zt)

    # -- the pipeline: the same two steps as calibdcd.fitted.fit_detector ----------------------
    def calibrate(self, config: CalibrationConfig) -> Calibration:
        return calibrate_classifier(
            self.original, self.z_cal, self.views, config, block=self.block, space=self.space
        )

    def final_scorer(self, cal: Calibration, clf: Any) -> Callable[[np.ndarray], np.ndarray]:
        return self.calibrated(cal, clf).score

    def retrain(self, cal: Calibration) -> Any:
        if not cal.corrected:
            return self.original

        def build() -> Any:
            return retrain_classifier(
                self.original, cal, self.z_sup, self.y_sup, self.new_classifier, space=self.space
            ).retrained

        if self.model_cache is not None:
            return self.model_cache("retrained", cal, build)
        return build()

    def run(self, config: CalibrationConfig) -> Outcome:
        return self.apply(self.calibrate(config))

    def apply(self, cal: Calibration) -> Outcome:
        """Retrain on a given correction and score the pool (``run`` after ``calibrate``)."""
        clf = self.retrain(cal)
        scores = self.final_scorer(cal, clf)(self.z_eval)
        return Outcome(
            calibration=cal,
            scores=scores,
            auc=auc(self.y_eval, scores),
            tpr=tpr_at_fpr(self.y_eval, scores, self.fpr),
            classifier=clf,
        )


# --------------------------------------------------------------------------------------------
# Variants
# --------------------------------------------------------------------------------------------


#: variant name -> display label: CalibDCD with one setting beyond the paper
VARIANTS = {
    "centred": "centred CalibDCD (beyond the paper)",
    "abstain": "abstaining CalibDCD (beyond the paper)",
    "normalized": "CalibDCD in the normalised space (beyond the paper)",
}

#: control name -> display label (controls, then the variants beyond the paper)
CONTROLS = {
    "placebo": "placebo (random basis)",
    "noise_floor": "noise floor (training-sample spread)",
    **VARIANTS,
}


def _with_basis(
    cal: Calibration, basis: np.ndarray, strength: float, rank: int | None
) -> Calibration:
    """``cal`` with another correction (diagnostics kept; centre dropped: origin-centred)."""
    return dataclasses.replace(cal, basis=basis, strength=strength, rank=rank, center=None)


def placebo_calibration(
    problem: CalibrationProblem,
    main: Calibration,
    base: CalibrationConfig,
    *,
    fixed_rank: int = 3,
    fixed_strength: float = 0.9,
    seed: int = 0,
) -> tuple[Calibration, str]:
    """A random orthonormal basis in ``main``'s block with its k and λ (or, when ``main`` is no
    correction, with the fixed configuration's size). Returns (calibration, size_from)."""
    if main.corrected:
        ref, k, lam, rank = main, main.basis.shape[1], main.strength, main.rank
        size_from = "calibdcd"
    else:
        ref = problem.calibrate(fixed_config(base, fixed_rank, fixed_strength))
        k = ref.basis.shape[1] or fixed_rank
        lam, rank, size_from = fixed_strength, fixed_rank, "fixed"
    block = ref.block
    k = min(k, block.size)
    rng = np.random.default_rng([seed, 0x91ACEB0])
    q, _ = np.linalg.qr(rng.normal(size=(block.size, k)))
    basis = np.zeros((ref.dim, k))
    basis[block] = q
    return _with_basis(ref, basis, float(lam), rank), size_from


#: the noise floor's methods (``analyses.noise_floor``; the first is the default)
NOISE_FLOORS = ("half_sample", "bootstrap")
#: complementary half-sample splits per setting (each gives two retrainings)
HALF_SAMPLE_SPLITS = 10


def _no_correction(main: Calibration) -> Calibration:
    return _with_basis(main, np.zeros((main.dim, 0)), 0.0, None)


def _refit(problem: CalibrationProblem, idx: np.ndarray, key: str, main: Calibration) -> Any:
    """A fresh classifier of the family fitted, without correction, on supervised rows ``idx``
    (through the problem's model cache under ``key`` when it has one)."""
    y = np.asarray(problem.y_sup)

    def build() -> Any:
        return problem.new_classifier().fit(problem.z_sup[idx], y[idx])

    if problem.model_cache is None:
        return build()
    return problem.model_cache(key, _no_correction(main), build)


def bootstrap_floor(problem: CalibrationProblem, main: Calibration, *, seed: int = 0) -> Outcome:
    """The ``bootstrap`` noise floor: the classifier refitted, without correction, on one
    stratified bootstrap resample of the supervised set (seeded), scored on the pool."""
    y = np.asarray(problem.y_sup)
    rng = np.random.default_rng([seed, 0xB007])
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    idx = np.sort(np.r_[rng.choice(pos, pos.size), rng.choice(neg, neg.size)])
    clf = _refit(problem, idx, "noise_floor", main)
    scores = np.asarray(clf.score(problem.z_eval), dtype=np.float64)
    return Outcome(
        calibration=_no_correction(main),
        scores=scores,
        auc=auc(problem.y_eval, scores),
        tpr=tpr_at_fpr(problem.y_eval, scores, problem.fpr),
        classifier=clf,
    )


def half_sample_indices(labels: np.ndarray, splits: int, seed: int = 0) -> list[np.ndarray]:
    """``2 * splits`` stratified half-samples without replacement: each split halves every
    class at random (⌊n_c / 2⌋ texts to each half; an odd text in neither) and gives both
    halves, sorted row indices. Seeded."""
    y = np.asarray(labels)
    rng = np.random.default_rng([seed, 0x4A1F])
    out = []
    for _ in range(splits):
        a, b = [], []
        for c in np.unique(y):
            rows = rng.permutation(np.flatnonzero(y == c))
            m = rows.size // 2
            a.append(rows[:m])
            b.append(rows[m : 2 * m])
        out += [np.sort(np.concatenate(a)), np.sort(np.concatenate(b))]
    return out


def half_sample_spread(
    full: float, halves: Sequence[float], fraction: float, level: float = 0.95
) -> dict[str, float]:
    """The n-sample spread of a statistic from its values on subsamples without replacement
    (the delete-d jackknife): ``full`` its value on all n, ``halves`` its values on subsamples
    of ``fraction`` = m/n of them. SD = √(m/(n − m)) · SD(halves) (factor 1 for halves);
    ``low``/``high`` = full ∓ z·SD with z the normal quantile of ``level``; ``shift`` = the
    subsamples' mean − full (the smaller sample's bias, kept out of the spread)."""
    h = np.asarray(halves, dtype=np.float64)
    if h.size < 2 or not 0.0 < fraction < 1.0:
        raise ValueError(f"need two or more subsamples of a fraction in (0, 1), got {h.size}, "
                         f"{fraction}")  # fmt: skip
    sd = float(np.sqrt(fraction / (1.0 - fraction)) * h.std(ddof=1))
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    return {"sd": sd, "low": full - z * sd, "high": full + z * sd, "shift": float(h.mean() - full)}


def half_sample_floor(
    problem: CalibrationProblem,
    main: Calibration,
    *,
    seed: int = 0,
    splits: int = HALF_SAMPLE_SPLITS,
    level: float = 0.95,
) -> dict[str, Any]:
    """The ``half_sample`` noise floor (module doc): the classifier retrained, without
    correction, on each stratified half of the supervised set (:func:`half_sample_indices`),
    scored on the pool; the interval around the detector's AUC and TPR at the training set's
    size (:func:`half_sample_spread`). Returns the summary fields (``auc_low``, ``auc_high``,
    ``auc_sd``, ``auc_shift``, the same for ``tpr``, the per-half ``auc_halves``)."""
    draws = half_sample_indices(problem.y_sup, splits, seed)
    aucs, tprs = [], []
    for i, idx in enumerate(draws):
        clf = _refit(problem, idx, f"noise_floor/half{i}of{len(draws)}", main)
        s = np.asarray(clf.score(problem.z_eval), dtype=np.float64)
        aucs.append(auc(problem.y_eval, s))
        tprs.append(tpr_at_fpr(problem.y_eval, s, problem.fpr))
    fraction = draws[0].size / np.asarray(problem.y_sup).size
    out: dict[str, Any] = {"method": "half_sample", "draws": len(draws),
                           "fraction": fraction, "level": level}  # fmt: skip
    for name, full, vals in (("auc", problem.auc_before, aucs), ("tpr", problem.tpr_before, tprs)):
        out.update(
            {f"{name}_{k}": v for k, v in half_sample_spread(full, vals, fraction, level).items()}
        )
    out["auc_halves"] = [float(a) for a in aucs]
    return out


@dataclasses.dataclass
class ControlOutcome:
    """One control or variant: its pool outcome, extra summary fields, and the scorer of raw
    features it defines (for every text of the subsample)."""

    outcome: Outcome
    extra: dict[str, Any]
    #: None for a control that is an interval around the detector (the half-sample noise
    #: floor): no per-text scores, no paired comparison of its own
    scorer: Callable[[np.ndarray], np.ndarray] | None


def noise_floor_control(
    problem: CalibrationProblem, main: Outcome, method: str, *, seed: int = 0,
    level: float = 0.95,
) -> ControlOutcome:  # fmt: skip
    """The noise floor of ``method`` (:data:`NOISE_FLOORS`) as a control: the half-sample one is
    the detector itself (its outcome, no scorer) with the interval in ``extra``; the bootstrap
    one a retrained classifier with its own pool scores."""
    if method == "half_sample":
        ident = _no_correction(main.calibration)
        centre = Outcome(ident, problem.scores_before, problem.auc_before, problem.tpr_before,
                         problem.original)  # fmt: skip
        spread = half_sample_floor(problem, main.calibration, seed=seed, level=level)
        return ControlOutcome(centre, spread, None)
    if method != "bootstrap":
        raise ValueError(f"unknown noise floor {method!r}: expected one of {NOISE_FLOORS}")
    floor = bootstrap_floor(problem, main.calibration, seed=seed)
    clf = floor.classifier
    return ControlOutcome(
        floor, {"method": "bootstrap"}, lambda z: np.asarray(clf.score(z), dtype=np.float64)
    )


def variant_configs(
    problem: CalibrationProblem, base: CalibrationConfig
) -> dict[str, tuple[CalibrationProblem, CalibrationConfig]]:
    """The variants beyond the paper that apply to ``problem`` (see :data:`VARIANTS`): name ->
    (the problem in its space, the changed config)."""
    out = {
        "centred": (problem, dataclasses.replace(base, centering="nonmembers")),
        "abstain": (problem, dataclasses.replace(base, guard=True)),
    }
    if problem.space == "raw" and has_normalized_space(problem.original):
        out["normalized"] = (dataclasses.replace(problem, space="normalized"), base)
    return out


def controls(
    problem: CalibrationProblem,
    main: Outcome,
    base: CalibrationConfig,
    *,
    fixed_rank: int = 3,
    fixed_strength: float = 0.9,
    seed: int = 0,
    noise_floor: str | None = NOISE_FLOORS[0],
    level: float = 0.95,
) -> dict[str, ControlOutcome]:
    """The controls and the variants beyond the paper (see the module doc), by name;
    ``noise_floor`` one of :data:`NOISE_FLOORS` (``level``: its interval's), or None for none
    (a score-only detector: its classifier learns nothing, so retraining it measures nothing)."""
    placebo, size_from = placebo_calibration(
        problem, main.calibration, base, fixed_rank=fixed_rank, fixed_strength=fixed_strength,
        seed=seed,
    )  # fmt: skip
    placebo_out = problem.apply(placebo)
    out: dict[str, ControlOutcome] = {
        "placebo": ControlOutcome(
            placebo_out,
            {"size_from": size_from},
            problem.final_scorer(placebo_out.calibration, placebo_out.classifier),
        ),
    }
    if noise_floor is not None:
        out["noise_floor"] = noise_floor_control(problem, main, noise_floor, seed=seed, level=level)
    for name, (prob, config) in variant_configs(problem, base).items():
        res = prob.run(config)
        out[name] = ControlOutcome(
            res,
            {"beyond_paper": True, "space": prob.space},
            prob.final_scorer(res.calibration, res.classifier),
        )
    return out


def ablation_configs(base: CalibrationConfig, seed: int) -> dict[str, CalibrationConfig]:
    """The paper's component ablations (one change each; random views seeded by ``seed``)."""
    return {
        "random3": dataclasses.replace(base, view_selection="random", seed=seed),
        "top1": dataclasses.replace(base, view_selection="top1"),
        "no_consensus": dataclasses.replace(base, consensus=False),
        "binary": dataclasses.replace(base, weighting="binary"),
    }


def fixed_config(base: CalibrationConfig, rank: int, strength: float) -> CalibrationConfig:
    """One (r, λ) candidate, applied regardless of its objective."""
    return dataclasses.replace(base, ranks=(rank,), strengths=(strength,), guard=False)


def full_correction_config(base: CalibrationConfig, main: Calibration) -> CalibrationConfig | None:
    """λ = 1 at the selected r, for settings whose selected λ < 1 (else None)."""
    if not main.corrected or main.strength >= 1.0 or main.rank is None:
        return None
    return fixed_config(base, main.rank, 1.0)


# --------------------------------------------------------------------------------------------
# False-positive recovery
# --------------------------------------------------------------------------------------------


def threshold_at_fpr(labels: np.ndarray, scores: np.ndarray, fpr: float) -> float:
    """The operating threshold of ``tpr_at_fpr``: predict member iff score ≥ threshold, at the
    largest ROC point with FPR ≤ ``fpr`` (+inf when only the empty prediction qualifies)."""
    f, _, thr = roc_curve(labels, scores)
    ok = np.flatnonzero(f <= fpr + 1e-12)
    return float(thr[ok.max()])


def fp_recovery(
    problem: CalibrationProblem, outcome: Outcome, *, fpr: float | None = None
) -> dict[str, Any]:
    """Decision-level effect of the calibration at the same FPR budget.

    * ``pool``: over the evaluation pool, non-members predicted member by the original detector
      at its own ``fpr`` threshold that the calibrated detector (at its own ``fpr`` threshold)
      predicts non-member (``recovered``), versus non-members newly above it (``new_fp``), and
      members lost / gained (``members_lost``, ``members_gained``).
    * ``affected`` (the paper's analysis): calibration non-members associated with the selected
      view of highest FPP (its score increase u > 0 for them) that the original detector
      misclassifies at the pool's ``fpr`` threshold; ``recovered`` counts those the calibrated
      detector classifies as non-members at its own threshold.
    """
    fpr = problem.fpr if fpr is None else fpr
    y = problem.y_eval
    s0, s1 = problem.scores_before, outcome.scores
    t0, t1 = threshold_at_fpr(y, s0, fpr), threshold_at_fpr(y, s1, fpr)
    p0, p1 = s0 >= t0, s1 >= t1
    nm, m = y == 0, y == 1
    pool = {
        "threshold_before": t0,
        "threshold_after": t1,
        "fp_before": int((p0 & nm).sum()),
        "fp_after": int((p1 & nm).sum()),
        "recovered": int((p0 & ~p1 & nm).sum()),
        "new_fp": int((~p0 & p1 & nm).sum()),
        "tp_before": int((p0 & m).sum()),
        "tp_after": int((p1 & m).sum()),
        "members_lost": int((p0 & ~p1 & m).sum()),
        "members_gained": int((~p0 & p1 & m).sum()),
    }
    cal = outcome.calibration
    affected: dict[str, Any] = {"view": None, "cases": 0, "recovered": 0, "rate": None}
    if cal.selected_views:
        top = max(cal.selected_views, key=lambda v: cal.fpp[v])
        q_cal = problem.score0(problem._cal_t)
        u = problem.score0(problem._views_t[top]) - q_cal
        orig = np.asarray(problem.original.score(problem.z_cal), dtype=np.float64)
        after = problem.final_scorer(cal, outcome.classifier)(problem.z_cal)
        cases = (u > 0) & (orig >= t0)
        rec = cases & (after < t1)
        n = int(cases.sum())
        affected = {
            "view": top,
            "cases": n,
            "recovered": int(rec.sum()),
            "rate": (float(rec.sum()) / n) if n else None,
        }
    return {"fpr": fpr, "pool": pool, "affected": affected}
