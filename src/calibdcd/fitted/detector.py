"""The fitted detector: fit once on known members and non-members, save, score new texts later.

Usage::

    from calibdcd import FitTexts, fit_detector, FittedDetector

    texts = FitTexts.split(members, nonmembers, seed=0)           # three disjoint non-member parts
    fitted = fit_detector(detector, target, texts, views=views,
                          calibration=CalibrationConfig(), fpr=0.05, mode="inductive")
    fitted.save("bundle/")
    fitted = FittedDetector.load("bundle/", target=current_target_record)
    result = fitted.score(new_texts, target, detector=fitted.build_detector(cache_dir))

What a fit uses (:class:`FitTexts`): the *supervised* texts with labels (the classifier), the
*calibration* non-members (CalibDCD), the *held-out* non-members (the null distribution of the
scores: decision threshold and empirical p-values; disjoint from the other two, so they are
unbiased) and an optional unlabelled *pool* the learnt parts may see.

Learnt parts trained on candidate texts without labels (VeilProbe's mapping model,
:class:`~calibdcd.detectors.base.PoolTrained`; DPDLLM's reference LM,
:class:`~calibdcd.detectors.base.ReferenceTrained`) follow ``mode``:

* ``inductive`` (default): trained once at fit time on the *fit pool* (supervised + calibration +
  pool texts; never the held-out non-members, which must be scored as new texts are); frozen in
  the bundle (their safetensors + JSON directories); new texts are scored with parts that never
  saw them.
* ``transductive``: scoring refits everything downstream of them on the fit pool + the held-out
  non-members + the new texts (no labels of the new texts are used): the learnt parts, the
  features, the classifier, CalibDCD and the null; as the paper's protocol does for its
  evaluation pool (DPDLLM's ``reference.arrangement: shared``). At fit time the held-out
  non-members are part of that pool too.

Detectors without learnt parts (the overlap detector) score identically in both modes.

A fit also says how well it separates the known texts it did not train on: a stratified 5-fold
cross-validation of the whole pipeline (classifier, CalibDCD, retraining) over the supervised
texts' features, already extracted (:func:`calibdcd.fitted.audit.cross_validated_separation`;
no model query), recorded as ``separation`` and warned when its AUC interval does not exclude
0.5.

A bundle (:meth:`FittedDetector.save`) is a directory: ``bundle.json`` (format version, versions,
target identity, detector spec, generation parameters, feature block layout, views, space,
threshold, settings), ``classifier.npz`` and ``retrained.npz`` (the classifiers' ``state()``, the
experiment's MODEL_FORMAT), ``calibration.npz`` + its JSON in ``bundle.json`` (the full basis,
centre, block and diagnostics), ``null.npz`` (held-out non-members' scores), ``texts.json`` (the
fit texts: transductive scoring refits on them, inductive restores VeilProbe's perturbation pool
from them, and a detector that needs known non-members, ReCaLL's prefix, gets the supervised
non-members from them at fit and at every score, so the same prefix) and ``learnt/<part>/``
(the learnt parts' files). No pickle anywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import shutil
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from calibdcd.atomic import atomic_write_bytes, atomic_write_text
from calibdcd.calibration import CalibrationConfig
from calibdcd.data.assemble import DEFAULT_TEXT_FIELDS
from calibdcd.data.textkey import first_occurrences, keys, text_key
from calibdcd.detectors.adapter import DetectorAdapter
from calibdcd.detectors.base import (
    PersistableClassifier,
    block_columns,
    decoding_record,
)
from calibdcd.fitted.audit import (
    cross_validated_separation,
    distribution_check,
    empirical_p_values,
    set_level_test,
    threshold_at,
)
from calibdcd.fitted.calibrated import (
    CalibratedClassifier,
    calibrate_classifier,
    calibration_from_state,
    calibration_state,
    resolve_space,
    retrain,
)
from calibdcd.redact import redact_tree
from calibdcd.targets.cache import completion_counts, empty_completions_warning

__all__ = [
    "FORMAT_VERSION",
    "BundleIntegrityError",
    "FitTexts",
    "FittedDetector",
    "Mode",
    "ScoreResult",
    "TargetMismatchError",
    "fit_detector",
    "read_bundle_header",
]

#: the bundle layout version (``bundle.json`` ``format_version``)
FORMAT_VERSION = 1
BUNDLE = "bundle.json"
Mode = Literal["inductive", "transductive"]
MODES = ("inductive", "transductive")

#: packages whose versions are recorded in a bundle and compared on load
VERSIONED = ("calibdcd", "numpy", "scipy", "scikit-learn", "torch", "transformers", "tokenizers")


class TargetMismatchError(ValueError):
    """A bundle was fitted on another target than the one it is asked to score with."""


# --------------------------------------------------------------------------------------------
# The fit's texts
# --------------------------------------------------------------------------------------------


def _texts(values: Sequence[str], what: str) -> tuple[str, ...]:
    if isinstance(values, str):
        raise ValueError(f"{what} must be a sequence of texts, not one string")
    out = tuple(values)
    for i, t in enumerate(out):
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"{what}[{i}] is not a non-empty string")
    return out


def _quote(text: str, width: int = 40) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= width else flat[: width - 1] + "…")


def _distinct(texts: Sequence[str], what: str) -> list[str]:
    """``texts`` without near-duplicates (the first of each normalised text kept), with a
    warning naming how many were dropped."""
    firsts = first_occurrences(texts)
    out = [t for t, j in zip(texts, firsts, strict=True) if j is None]
    if len(out) < len(texts):
        warnings.warn(
            f"{what}: {len(texts) - len(out)} repeated text(s) dropped (the same after Unicode "
            f"NFC and whitespace collapsing); {len(out)} distinct kept",
            UserWarning,
            stacklevel=3,
        )
    return out


@dataclasses.dataclass(frozen=True)
class FitTexts:
    """The texts of a fit: ``supervised`` with ``labels`` (1 = member), ``calibration`` and
    ``heldout`` known non-members, and an unlabelled ``pool`` (may be empty). The three labelled
    parts must be disjoint."""

    supervised: tuple[str, ...]
    labels: tuple[int, ...]
    calibration: tuple[str, ...] = ()
    heldout: tuple[str, ...] = ()
    pool: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("supervised", "calibration", "heldout", "pool"):
            object.__setattr__(self, name, _texts(getattr(self, name), name))
        labels = tuple(int(y) for y in self.labels)
        object.__setattr__(self, "labels", labels)
        if len(labels) != len(self.supervised):
            raise ValueError(f"{len(self.supervised)} supervised texts, {len(labels)} labels")
        if set(labels) != {0, 1}:
            raise ValueError("the supervised texts need both members (1) and non-members (0)")
        if not self.heldout:
            raise ValueError("heldout: the threshold and p-values need held-out non-members")
        # "the same text" is the same normalised text (calibdcd.data.textkey): a held-out
        # non-member with a near-copy elsewhere in the fit is not out-of-sample
        held = keys(self.heldout)
        for name in ("supervised", "calibration"):
            both = [t for t in getattr(self, name) if text_key(t) in held]
            if both:
                raise ValueError(
                    f"heldout and {name} share {len(both)} text(s) (compared after Unicode NFC "
                    f"and whitespace collapsing), e.g. {_quote(both[0])}: the held-out "
                    "non-members must be disjoint from everything else the fit uses"
                )
        cal = keys(self.calibration)
        both = [t for t in self.supervised if text_key(t) in cal]
        if both:
            raise ValueError(
                f"supervised and calibration share {len(both)} text(s) (compared after Unicode "
                f"NFC and whitespace collapsing), e.g. {_quote(both[0])}"
            )

    @classmethod
    def split(
        cls,
        members: Sequence[str],
        nonmembers: Sequence[str],
        *,
        heldout_fraction: float = 0.3,
        calibration_fraction: float = 0.3,
        n_supervised_per_class: int | None = None,
        seed: int = 0,
        pool: Sequence[str] = (),
    ) -> FitTexts:
        """Known members and non-members into the three disjoint parts (seeded): the
        non-members into held-out (``heldout_fraction``), calibration (``calibration_fraction``)
        and supervised (the rest); every member (or ``n_supervised_per_class``) supervised."""
        members = _distinct(_texts(members, "members"), "members")
        nonmembers = _distinct(_texts(nonmembers, "nonmembers"), "nonmembers")
        mkeys = keys(members)
        overlap = [t for t in nonmembers if text_key(t) in mkeys]
        if overlap:
            raise ValueError(
                f"{len(overlap)} text(s) are both members and non-members (compared after "
                f"Unicode NFC and whitespace collapsing), e.g. {_quote(overlap[0])}"
            )
        if not 0 < heldout_fraction < 1 or not 0 <= calibration_fraction < 1:
            raise ValueError("heldout_fraction must be in (0, 1), calibration_fraction in [0, 1)")
        if heldout_fraction + calibration_fraction >= 1:
            raise ValueError("heldout_fraction + calibration_fraction must leave supervised ones")
        rng = np.random.default_rng([seed, 0xF17])
        nm = [nonmembers[i] for i in rng.permutation(len(nonmembers))]
        n_held = max(1, round(heldout_fraction * len(nm)))
        n_cal = round(calibration_fraction * len(nm))
        held, cal, sup_nm = nm[:n_held], nm[n_held : n_held + n_cal], nm[n_held + n_cal :]
        mem = [members[i] for i in rng.permutation(len(members))]
        if n_supervised_per_class is not None:
            mem, sup_nm = mem[:n_supervised_per_class], sup_nm[:n_supervised_per_class]
        if not mem or not sup_nm:
            raise ValueError("too few texts: no supervised members or non-members left")
        sup = mem + sup_nm
        labels = [1] * len(mem) + [0] * len(sup_nm)
        order = rng.permutation(len(sup))
        return cls(
            supervised=tuple(sup[i] for i in order),
            labels=tuple(labels[i] for i in order),
            calibration=tuple(cal),
            heldout=tuple(held),
            pool=tuple(pool),
        )

    @classmethod
    def from_files(
        cls,
        members: str | Path,
        nonmembers: str | Path,
        *,
        text_field: str | Sequence[str] = DEFAULT_TEXT_FIELDS,
        **split: Any,
    ) -> FitTexts:
        """:meth:`split` of the known members and non-members read from two files by the one
        reader of text inputs (:func:`calibdcd.data.load_texts`: jsonl, json, csv, tsv,
        parquet, ``.txt`` one text per line, and their ``.gz`` forms)."""
        from calibdcd.data import load_texts

        return cls.split(
            load_texts(members, text_field=text_field).texts,
            load_texts(nonmembers, text_field=text_field).texts,
            **split,
        )

    def supervised_nonmembers(self) -> list[str]:
        """The supervised texts labelled non-member, in order: the known non-members a
        detector's features may use (ReCaLL's prefix; never the held-out ones, which stand for
        new texts)."""
        return [t for t, y in zip(self.supervised, self.labels, strict=True) if y == 0]

    def part_of(self, texts: Sequence[str]) -> list[str | None]:
        """For each text, the labelled fit part that holds it: ``supervised``, ``calibration``
        (known non-members) or ``heldout`` (the null itself); None otherwise (texts compared
        by :func:`calibdcd.data.textkey.text_key`: a copy with other whitespace is the same
        text). The unlabelled
        ``pool`` is not counted: scoring texts the learnt parts saw without labels is the
        protocol's (transductive) design."""
        where: dict[str, str] = {}
        for name in ("heldout", "calibration", "supervised"):  # the last one wins
            for t in getattr(self, name):
                where[text_key(t)] = name
        return [where.get(text_key(t)) for t in texts]

    def fit_pool(self, mode: Mode) -> list[str]:
        """The unlabelled texts the learnt parts are trained on at fit time (order kept,
        duplicates dropped): supervised + calibration + pool, plus held-out when transductive."""
        parts = [self.supervised, self.calibration, self.pool]
        if mode == "transductive":
            parts.append(self.heldout)
        return list(dict.fromkeys(t for p in parts for t in p))

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) for k, v in dataclasses.asdict(self).items()}


# --------------------------------------------------------------------------------------------
# Feature extraction with the learnt parts
# --------------------------------------------------------------------------------------------


def _extract(detector: Any, target: Any, texts: Sequence[str], view: Any, pool: list[str]) -> Any:
    adapter = DetectorAdapter(detector)
    return adapter.extract(texts, target, view, adapter.reference_texts(texts, pool))


def _use_nonmembers(detector: Any, texts: FitTexts) -> None:
    """Hand a detector that needs known non-members the fit's supervised ones (a no-op for
    others): at fit and at every score, from the same texts (the bundle's ``texts.json``)."""
    DetectorAdapter(detector).use_nonmembers(texts.supervised_nonmembers())


def _prepare(detector: Any, target: Any, pool: list[str], mode: Mode) -> None:
    adapter = DetectorAdapter(detector)
    if adapter.takes_reference and mode == "inductive":
        if adapter.reference_texts(["x"], pool) != pool:  # per split: not frozen
            raise ValueError(
                f"{detector.name}: mode inductive needs one reference model for every text "
                "(reference.arrangement: shared); use mode transductive for per_split"
            )
    adapter.prepare(pool, target)


def _learnt_parts(detector: Any, target: Any, pool: list[str]) -> dict[str, Path]:
    return DetectorAdapter(detector).learnt_parts(target, pool)


@dataclasses.dataclass
class _Fit:
    scorer: CalibratedClassifier
    null: np.ndarray
    blocks: dict[str, slice]
    block: np.ndarray | None
    generation: dict[str, Any]
    sizes: dict[str, int]
    #: refits the whole pipeline on some supervised rows (the cross-validated check)
    refit: Callable[[np.ndarray, np.ndarray], CalibratedClassifier] | None = None
    z_sup: np.ndarray | None = None
    y_sup: np.ndarray | None = None


class _Steps:
    """A status callback that numbers its messages: ``step k of n: <message>``."""

    def __init__(self, status: Callable[[str], None] | None, total: int) -> None:
        self.status, self.total, self.k = status, total, 0

    def __call__(self, message: str) -> None:
        self.k += 1
        if self.status is not None:
            self.status(f"step {min(self.k, self.total)} of {self.total}: {message}")


def _pipeline_steps(views: Sequence[Any], calibration: CalibrationConfig | None) -> int:
    """Status messages of :func:`_fit_pipeline`: supervised, (calibration, each view), held-out."""
    return 2 + (1 + len(views) if calibration is not None else 0)


def _texts_n(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def _completions_record(
    target: Any, served0: int, empty0: int, measures: str, *, warn: bool = True
) -> dict[str, Any]:
    """The completions the target served since ``(served0, empty0)`` and the one check of
    ``run``, ``fit`` and ``score`` on empty ones (:func:`calibdcd.targets.cache.
    empty_completions_warning`), warned when it fires (``warn``); recorded in the bundle
    (fit) or among the score's warnings."""
    served1, empty1 = completion_counts(target)
    served, empty = served1 - served0, empty1 - empty0
    said = empty_completions_warning(served, empty, measures=measures)
    if said and warn:
        warnings.warn(said, RuntimeWarning, stacklevel=3)
    return {"served": served, "empty": empty, "warning": said}


def achievable_fpr(n_null: int, fpr: float) -> float:
    """The FPR a conformal threshold on ``n_null`` held-out scores spends: ⌊fpr·(n+1)⌋/(n+1)."""
    return math.floor(fpr * (n_null + 1) + 1e-12) / (n_null + 1)


def _warn_fpr_budget(n_null: int, n_heldout: int, fpr: float) -> None:
    """Warn when the held-out count leaves a fifth or more of the FPR budget unused."""
    got = achievable_fpr(n_null, fpr)
    if got >= 0.8 * fpr:
        return
    best = math.ceil(1 / fpr - 1e-9) * max(1, math.ceil(fpr * (n_null + 1))) - 1
    lost = f" ({n_heldout - n_null} had no finite features)" if n_heldout > n_null else ""
    warnings.warn(
        f"{n_null} held-out non-members{lost}: the threshold can spend only {got:.1%} of the "
        f"requested {fpr:.1%} false-positive rate (conformal: ⌊fpr·(n+1)⌋/(n+1)); "
        f"{best} held-out non-members would spend all of it",
        RuntimeWarning,
        stacklevel=4,
    )


def _finite_rows(z: np.ndarray) -> np.ndarray:
    return np.all(np.isfinite(z), axis=1)


def _fit_pipeline(
    detector: Any,
    target: Any,
    texts: FitTexts,
    pool: list[str],
    *,
    views: Sequence[Any],
    calibration: CalibrationConfig | None,
    space: str,
    seed: int,
    say: Callable[[str], None],
) -> _Fit:
    """Features of every part, the classifier, CalibDCD and the held-out null."""
    n_m = sum(texts.labels)
    ref = (
        f"; its reference model trains on the {len(pool):,} fit-pool texts first"
        if DetectorAdapter(detector).takes_reference
        else ""
    )
    say(
        f"features of the {_texts_n(len(texts.supervised), 'supervised text')} ({n_m:,} "
        f"members{ref})"
    )
    f_sup = _extract(detector, target, texts.supervised, None, pool)
    generation = decoding_record(detector, target, f_sup)
    z_sup = np.asarray(f_sup.values, dtype=np.float64)
    y_sup = np.asarray(texts.labels)
    ok = _finite_rows(z_sup)
    z_sup, y_sup = z_sup[ok], y_sup[ok]
    blocks = dict(f_sup.blocks)
    block = block_columns(blocks, detector.calibration_blocks)

    def new_clf() -> Any:
        return detector.new_classifier(seed)

    original = new_clf().fit(z_sup, y_sup)
    sp = resolve_space(original, space)
    scorer = CalibratedClassifier(original, None, None, sp)

    def refit_plain(z: np.ndarray, y: np.ndarray) -> CalibratedClassifier:
        return CalibratedClassifier(new_clf().fit(z, y), None, None, sp)

    refit: Callable[[np.ndarray, np.ndarray], CalibratedClassifier] = refit_plain
    n_cal = 0
    if calibration is not None:
        if not texts.calibration:
            raise ValueError("CalibDCD needs calibration non-members (FitTexts.calibration)")
        if not views:
            raise ValueError("CalibDCD needs the target's views")
        n_c = _texts_n(len(texts.calibration), "calibration non-member")
        say(f"features of the {n_c} (CalibDCD's)")
        z_cal = np.asarray(_extract(detector, target, texts.calibration, None, pool).values)
        z_views = {}
        for i, v in enumerate(views, start=1):
            say(f"features of the {n_c} under view {v.code} ({i} of {len(views)})")
            z_views[v.code] = np.asarray(
                _extract(detector, target, texts.calibration, v, pool).values
            )
        ok_cal = _finite_rows(z_cal)
        for zv in z_views.values():
            ok_cal &= _finite_rows(zv)
        n_cal = int(ok_cal.sum())
        cal = calibrate_classifier(
            original,
            z_cal[ok_cal],
            {k: v[ok_cal] for k, v in z_views.items()},
            calibration,
            block=block,
            space=sp,
        )
        scorer = retrain(original, cal, z_sup, y_sup, new_clf, space=sp)
        z_cal_ok = z_cal[ok_cal]
        z_views_ok = {k: v[ok_cal] for k, v in z_views.items()}

        def refit_calibrated(z: np.ndarray, y: np.ndarray) -> CalibratedClassifier:
            assert calibration is not None
            orig = new_clf().fit(z, y)
            c = calibrate_classifier(orig, z_cal_ok, z_views_ok, calibration, block=block, space=sp)
            return retrain(orig, c, z, y, new_clf, space=sp)

        refit = refit_calibrated

    say(f"features of the {_texts_n(len(texts.heldout), 'held-out non-member')} (the null)")
    z_held = np.asarray(_extract(detector, target, texts.heldout, None, pool).values)
    null = scorer.score(z_held[_finite_rows(z_held)])
    if null.size == 0:
        raise ValueError("no held-out non-member has finite features")
    sizes = {
        "supervised": int(y_sup.size),
        "supervised_members": int(y_sup.sum()),
        "calibration": n_cal,
        "heldout": int(null.size),
        "pool": len(pool),
    }
    return _Fit(scorer, null, blocks, block, generation, sizes, refit, z_sup, y_sup)


# --------------------------------------------------------------------------------------------
# The fitted detector
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ScoreResult:
    """Per text: score, empirical p-value, decision; for the set: the test and the check."""

    scores: np.ndarray
    p_values: np.ndarray
    decisions: np.ndarray
    threshold: float
    fpr: float
    set_test: dict[str, Any] | None
    distribution: dict[str, Any] | None
    warnings: list[str]
    #: per text: the labelled fit part it was in ("supervised", "calibration", "heldout") or None
    in_fit: list[str | None] = dataclasses.field(default_factory=list)
    #: per text: whether it counts in the set-level test and the distribution check (distinct
    #: and not a fit text)
    in_set_test: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=bool))


@dataclasses.dataclass
class FittedDetector:
    """Everything needed to score texts later (see the module doc)."""

    scorer: CalibratedClassifier
    null: np.ndarray  #: held-out known non-members' scores
    fpr: float
    mode: Mode
    seed: int
    detector_spec: dict[str, Any]  #: {name, preset, options, benchmark}: create_detector args
    #: the target's identity record (:func:`calibdcd.targets.identity.target_record`)
    target: dict[str, Any]
    texts: FitTexts
    blocks: dict[str, slice]
    block: np.ndarray | None
    views: list[Any]
    calibration_config: CalibrationConfig | None
    space_requested: str
    generation: dict[str, Any]
    sizes: dict[str, int]
    learnt: dict[str, Path] = dataclasses.field(default_factory=dict)
    versions: dict[str, str | None] = dataclasses.field(default_factory=dict)
    #: how well the fit separates known texts it did not train on
    #: (:func:`calibdcd.fitted.audit.cross_validated_separation`'s record; None: not checked)
    separation: dict[str, Any] | None = None
    #: when the fit ran (UTC, ISO 8601 to the second)
    fitted_at: str | None = None
    format_version: int = FORMAT_VERSION

    @property
    def threshold(self) -> float:
        """Scores strictly above it are declared members (p ≤ ``fpr``)."""
        return threshold_at(self.null, self.fpr)

    # -- scoring ---------------------------------------------------------------------------
    def attach(self, detector: Any, target: Any) -> Any:
        """Install what the fit froze into a freshly built ``detector``: the known non-members
        (a detector that needs them) and the learnt parts (inductive)."""
        _use_nonmembers(detector, self.texts)
        if self.mode != "inductive" or not self.learnt:
            return detector
        pool = self.texts.fit_pool("inductive")
        DetectorAdapter(detector).restore_parts(self.learnt, pool, target)
        return detector

    def score_features(self, z: np.ndarray) -> np.ndarray:
        """Scores of raw feature rows (NaN for rows with missing features)."""
        z = np.asarray(z, dtype=np.float64)
        out = np.full(z.shape[0], np.nan)
        ok = _finite_rows(z)
        if ok.any():
            out[ok] = self.scorer.score(z[ok])
        return out

    def score(
        self,
        texts: Sequence[str],
        target: Any,
        detector: Any,
        *,
        set_alpha: float = 0.05,
        check_distribution: bool = True,
        status: Callable[[str], None] | None = None,
    ) -> ScoreResult:
        """Score ``texts`` with the target (``detector`` built by :meth:`build_detector`;
        in inductive mode its learnt parts are restored from the bundle first)."""
        if not 0.0 < float(set_alpha) < 1.0:
            raise ValueError(f"set_alpha must lie in (0, 1), got {set_alpha!r}")
        new = list(_texts(texts, "texts"))
        n_steps = 1 + int(check_distribution)
        if self.mode == "transductive":
            n_steps += int(DetectorAdapter(detector).pool_trained) + _pipeline_steps(
                self.views, self.calibration_config
            )
        say = _Steps(status, n_steps)
        if self.mode == "transductive":
            pool = list(dict.fromkeys([*self.texts.fit_pool("transductive"), *new]))
            _use_nonmembers(detector, self.texts)
            if DetectorAdapter(detector).pool_trained:
                say(f"refitting the learnt parts on {_texts_n(len(pool), 'text')} (transductive)")
            _prepare(detector, target, pool, "transductive")
            fit = _fit_pipeline(
                detector, target, self.texts, pool, views=self.views,
                calibration=self.calibration_config, space=self.space_requested,
                seed=self.seed, say=say,
            )  # fmt: skip
            scorer, null = fit.scorer, fit.null
        else:
            pool = self.texts.fit_pool("inductive")
            self.attach(detector, target)
            scorer, null = self.scorer, self.null
        say(f"features of the {_texts_n(len(new), 'text')} to score")
        served0, empty0 = completion_counts(target)
        z = np.asarray(_extract(detector, target, new, None, pool).values, dtype=np.float64)
        completions = _completions_record(target, served0, empty0, "every score", warn=False)
        scores = np.full(len(new), np.nan)
        ok = _finite_rows(z)
        if ok.any():
            scores[ok] = scorer.score(z[ok])
        p = empirical_p_values(scores, null)
        thr = threshold_at(null, self.fpr)
        decisions = np.where(np.isfinite(scores), scores > thr, False)
        notes: list[str] = [completions["warning"]] if completions["warning"] else []
        if (~ok).any():
            notes.append(f"{int((~ok).sum())} text(s) have missing features: score NaN")
        # the set-level test and the distribution check assume distinct texts that the fit
        # never saw: a repeated text would count twice (and leak across the check's folds), a
        # fit text is not out-of-sample
        in_fit = self.texts.part_of(new)
        first = np.array([j is None for j in first_occurrences(new)], dtype=bool)
        n_dup = int((~first).sum())
        if n_dup:
            notes.append(
                f"{n_dup} repeated text(s) (the same after Unicode NFC and whitespace "
                "collapsing): each distinct text counts once in the set-level test and the "
                "distribution check"
            )
        fit_hits = [i for i, part in enumerate(in_fit) if part is not None and first[i]]
        if fit_hits:
            parts = sorted({str(in_fit[i]) for i in fit_hits})
            notes.append(
                f"{len(fit_hits)} text(s) were part of the fit ({', '.join(parts)}): their scores "
                "are not out-of-sample; left out of the set-level test and the distribution check"
            )
        use = first & np.array([part is None for part in in_fit], dtype=bool)
        st = None
        if (ok & use).sum() >= 1:
            st = set_level_test(scores[use], null, alpha=set_alpha).as_dict()
        dist = None
        if check_distribution and use.any():
            say(
                "the distribution check (a model-free classifier: suspect texts against the "
                f"{len(self.texts.heldout):,} held-out non-members)"
            )
            kept = [t for t, u in zip(new, use, strict=True) if u]
            d = distribution_check(kept, self.texts.heldout, seed=self.seed)
            dist = d.as_dict()
            if d.warning:
                notes.append(d.warning)
        return ScoreResult(scores, p, decisions, thr, self.fpr, st, dist, notes, in_fit, use & ok)

    def build_detector(self, cache_dir: str | Path) -> Any:
        """A fresh detector from the bundle's spec, for library use (its lab references as
        written: ``calibdcd score`` plans it as ``fit`` did, references resolved)."""
        from calibdcd.detectors.registry import create_detector

        spec = self.detector_spec
        return create_detector(
            spec["name"],
            preset=spec.get("preset"),
            options=spec.get("options") or {},
            benchmark=spec.get("benchmark"),
            cache_dir=str(cache_dir),
        )

    # -- persistence -----------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write the bundle (see the module doc); an existing bundle there is replaced."""
        from calibdcd.persist import pack_state

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for clf, name in (
            (self.scorer.original, "classifier"),
            (self.scorer.retrained, "retrained"),
        ):
            path = out / f"{name}.npz"
            if clf is None:
                path.unlink(missing_ok=True)
                continue
            if not isinstance(clf, PersistableClassifier):
                raise TypeError(f"{type(clf).__name__} has no state(): it cannot be saved")
            atomic_write_bytes(path, pack_state(clf))
        cal_meta = None
        if self.scorer.calibration is not None:
            arrays, cal_meta = calibration_state(self.scorer.calibration)
            _savez(out / "calibration.npz", arrays)
        _savez(out / "null.npz", {"scores": self.null})
        atomic_write_text(out / "texts.json", json.dumps(self.texts.as_dict(), ensure_ascii=False))
        learnt_rel: dict[str, str] = {}
        learnt_dir = out / "learnt"
        for name, src in self.learnt.items():
            dst = learnt_dir / name
            if Path(src).resolve() != dst.resolve():
                if dst.exists():
                    shutil.rmtree(dst)
                shutil.copytree(src, dst)
            learnt_rel[name] = f"learnt/{name}"
        header = {
            "format_version": self.format_version,
            "versions": self.versions,
            "target": self.target,
            "detector": self.detector_spec,
            "mode": self.mode,
            "fpr": self.fpr,
            "seed": self.seed,
            "space": self.scorer.space,
            "space_requested": self.space_requested,
            "threshold": self.threshold,
            "feature_blocks": {k: [v.start, v.stop] for k, v in self.blocks.items()},
            "calibration_block": None if self.block is None else self.block.tolist(),
            "views": [v.as_dict() for v in self.views],
            "calibration_config": None
            if self.calibration_config is None
            else self.calibration_config.kwargs(),
            "calibration": cal_meta,
            "generation": self.generation,
            "sizes": self.sizes,
            "separation": self.separation,
            "fitted_at": self.fitted_at,
            "learnt": learnt_rel,
            "texts_sha256": _texts_digest(self.texts),
            # every array and file of the bundle, and this header itself: load() refuses a
            # bundle whose null scores, classifiers, calibration or settings were changed
            "files_sha256": _file_digests(out),
        }
        # a bundle is meant to be shared: no credential of the target (URL passwords, keys
        # from ${..._KEY} variables or `secrets:`, headers and options naming one, wherever they
        # are quoted: the target, the decoding record's sent options) is written into it. The
        # whole header passes the redactor run directories use, before its digest.
        header = redact_tree(json.loads(json.dumps(header, sort_keys=True, default=str)))
        header["header_sha256"] = _header_digest(header)
        atomic_write_text(out / BUNDLE, json.dumps(header, indent=2, sort_keys=True))
        return out

    @classmethod
    def load(
        cls,
        directory: str | Path,
        *,
        target: Mapping[str, Any] | None = None,
        check_versions: bool = True,
        allow_unverified: bool = False,
    ) -> FittedDetector:
        """Read a bundle. ``target`` (the current target's identity record) must match the
        fitted one (else :class:`TargetMismatchError` naming what differs); differing package
        versions give a warning naming them. A bundle without digests is refused unless
        ``allow_unverified`` (:class:`BundleIntegrityError`)."""
        from calibdcd.persist import unpack_state
        from calibdcd.views import View

        d = Path(directory)
        hp = d / BUNDLE
        h = read_bundle_header(d)  # its own digest checked
        if h.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{hp}: format_version {h.get('format_version')!r}; this calibdcd reads "
                f"{FORMAT_VERSION}"
            )
        _check_integrity(d, h, allow_unverified=allow_unverified)
        if target is not None:
            check_target(h["target"], target, where=str(hp))
        if check_versions:
            diff = version_differences(h.get("versions") or {}, package_versions())
            if diff:
                warnings.warn(
                    f"{hp}: fitted with other package versions ({'; '.join(diff)}); scores may "
                    "differ slightly from the fit's",
                    RuntimeWarning,
                    stacklevel=2,
                )
        from calibdcd.detectors.registry import detector_factory

        detector_factory(h["detector"]["name"])  # a clear error for an unknown detector
        with _reading(d / "classifier.npz"):
            original = _load_classifier(d / "classifier.npz", unpack_state)
        retrained = None
        if (d / "retrained.npz").is_file():
            with _reading(d / "retrained.npz"):
                retrained = _load_classifier(d / "retrained.npz", unpack_state)
        cal = None
        if h.get("calibration") is not None:
            cp = d / "calibration.npz"
            with _reading(cp), np.load(cp, allow_pickle=False) as f:
                cal = calibration_from_state({k: f[k] for k in f.files}, h["calibration"])
        with _reading(d / "null.npz"), np.load(d / "null.npz", allow_pickle=False) as f:
            null = np.asarray(f["scores"], dtype=np.float64)
        with _reading(d / "texts.json"):
            raw = json.loads((d / "texts.json").read_text(encoding="utf-8"))
            texts = FitTexts(**{k: tuple(v) for k, v in raw.items()})
        if _texts_digest(texts) != h.get("texts_sha256"):
            raise ValueError(f"{d / 'texts.json'}: does not match the bundle's texts_sha256")
        cc = h.get("calibration_config")
        blk = h.get("calibration_block")
        return cls(
            scorer=CalibratedClassifier(original, cal, retrained, h["space"]),
            null=null,
            fpr=float(h["fpr"]),
            mode=h["mode"],
            seed=int(h["seed"]),
            detector_spec=h["detector"],
            target=h["target"],
            texts=texts,
            blocks={k: slice(a, b) for k, (a, b) in h["feature_blocks"].items()},
            block=None if blk is None else np.asarray(blk, dtype=np.intp),
            views=[View(**v) for v in h["views"]],
            calibration_config=None if cc is None else CalibrationConfig(**cc),
            space_requested=h.get("space_requested", "auto"),
            generation=h.get("generation") or {},
            sizes=h.get("sizes") or {},
            learnt={k: d / rel for k, rel in (h.get("learnt") or {}).items()},
            versions=h.get("versions") or {},
            separation=h.get("separation"),
            fitted_at=h.get("fitted_at"),
        )


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """A bundle file that cannot be read (truncated, missing, not what it should be) is a
    :class:`BundleIntegrityError` naming it, also when the bundle is loaded unverified."""
    try:
        yield
    except (BundleIntegrityError, TargetMismatchError):
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise BundleIntegrityError(
            f"{path}: cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())}); "
            "the bundle is damaged or incomplete: fit it again"
        ) from exc


def _load_classifier(path: Path, unpack: Callable[[Path, type], Any]) -> Any:
    """A classifier saved with ``pack_state``: its class is named in the header and must be
    one a registered detector builds (import by name, never unpickled)."""
    import importlib

    with np.load(path, allow_pickle=False) as f:
        header = json.loads(f["__header__"].tobytes().decode("utf-8"))
    module, _, qual = str(header.get("class", "")).rpartition(".")
    if not module.startswith("calibdcd."):
        raise ValueError(f"{path}: classifier class {header.get('class')!r} is not calibdcd's")
    cls = getattr(importlib.import_module(module), qual)
    return unpack(path, cls)


def _savez(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    from calibdcd.atomic import atomic_savez

    atomic_savez(path, {k: np.asarray(v) for k, v in arrays.items()})


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: the files a bundle consists of besides ``bundle.json`` (and everything under ``learnt/``)
_BUNDLE_FILES = ("classifier.npz", "retrained.npz", "calibration.npz", "null.npz", "texts.json")


def _file_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file of a bundle but ``bundle.json`` (relative POSIX paths); other files
    a user keeps in the directory are not part of the bundle."""
    files = [directory / n for n in _BUNDLE_FILES if (directory / n).is_file()]
    files += sorted(p for p in (directory / "learnt").rglob("*") if p.is_file())
    return {p.relative_to(directory).as_posix(): _sha256_file(p) for p in files}


def _header_digest(header: Mapping[str, Any]) -> str:
    body = {k: v for k, v in header.items() if k != "header_sha256"}
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class BundleIntegrityError(ValueError):
    """A bundle file that is not what the fit wrote (edited, replaced, truncated or missing)."""


def _read_header(path: Path) -> dict[str, Any]:
    try:
        h = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise BundleIntegrityError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise BundleIntegrityError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "truncated or edited? refit the bundle"
        ) from None
    if not isinstance(h, dict):
        raise BundleIntegrityError(f"{path}: not a bundle header (a JSON object)")
    return h


def read_bundle_header(directory: str | Path) -> dict[str, Any]:
    """A bundle's ``bundle.json``, checked against its own digest (one clear error if not)."""
    d = Path(directory)
    hp = d / BUNDLE
    if not hp.is_file():
        raise FileNotFoundError(f"{hp}: not a fitted-detector bundle (no {BUNDLE})")
    h = _read_header(hp)
    if "header_sha256" in h and _header_digest(h) != h["header_sha256"]:
        raise BundleIntegrityError(
            f"{hp}: changed after the fit wrote it (its settings, e.g. fpr or threshold, no "
            "longer match their digest); refit, or restore the file"
        )
    return h


def _check_integrity(
    directory: Path, header: Mapping[str, Any], *, allow_unverified: bool = False
) -> None:
    """Refuse a bundle whose files differ from what the fit wrote, naming the file (the header
    itself is checked by :func:`read_bundle_header`). A bundle without digests (written by a
    calibdcd before them, or edited to remove them: the two look alike) is refused too, unless
    ``allow_unverified``: then it loads with a warning."""
    files = header.get("files_sha256")
    if files is None or "header_sha256" not in header:
        if not allow_unverified:
            raise BundleIntegrityError(
                f"{directory / BUNDLE}: carries no digests (written by a calibdcd before them, "
                "or edited to remove them), so its files cannot be checked; refit, or score "
                "it unchecked with --allow-unverified"
            )
        warnings.warn(
            f"{directory / BUNDLE}: written without digests; loaded unchecked (allow_unverified)",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    for rel, want in files.items():
        path = directory / rel
        if not path.is_file():
            raise BundleIntegrityError(f"{path}: missing from the bundle (the fit wrote it)")
        if _sha256_file(path) != want:
            raise BundleIntegrityError(
                f"{path}: changed after the fit wrote it (sha256 differs from bundle.json's "
                "files_sha256); refit, or restore the file"
            )


def _texts_digest(texts: FitTexts) -> str:
    body = json.dumps(texts.as_dict(), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def package_versions() -> dict[str, str | None]:
    from calibdcd.provenance import library_versions

    return dict(library_versions(VERSIONED))


def version_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    return [
        f"{k} {saved.get(k)} -> {current.get(k)}"
        for k in sorted(set(saved) | set(current))
        if saved.get(k) != current.get(k)
    ]


#: fields of a target record whose difference means another model (an error on load)
IDENTITY_FIELDS = ("backend", "content", "revision", "model")


def check_target(saved: Mapping[str, Any], current: Mapping[str, Any], *, where: str) -> None:
    """Error (:class:`TargetMismatchError`) when the model differs; a warning for other
    differences (decoding options, family)."""
    current = redact_tree(dict(current))  # as the bundle recorded it: credentials masked
    hard = IDENTITY_FIELDS
    if saved.get("content") and current.get("content"):  # the files decide, not their name
        hard = ("backend", "content")
    bad = [
        f"{k}: fitted {saved.get(k)!r}, now {current.get(k)!r}"
        for k in hard
        if saved.get(k) != current.get(k)
    ]
    if bad:
        raise TargetMismatchError(
            f"{where}: the bundle was fitted on another target ({'; '.join(bad)}); its "
            "threshold, p-values and classifier do not apply to this model"
        )
    soft = [
        f"{k}: fitted {saved.get(k)!r}, now {current.get(k)!r}"
        for k in sorted(set(saved) | set(current))
        if k not in hard and saved.get(k) != current.get(k)
    ]
    if soft:
        warnings.warn(
            f"{where}: same model, other target settings ({'; '.join(soft)})",
            RuntimeWarning,
            stacklevel=3,
        )


def fit_detector(
    detector: Any,
    target: Any,
    texts: FitTexts,
    *,
    views: Sequence[Any] = (),
    calibration: CalibrationConfig | None = None,
    space: str = "raw",
    fpr: float = 0.05,
    mode: Mode = "inductive",
    seed: int = 0,
    detector_spec: Mapping[str, Any] | None = None,
    target_record: Mapping[str, Any] | None = None,
    status: Callable[[str], None] | None = None,
) -> FittedDetector:
    """Fit ``detector`` (+ CalibDCD when ``calibration`` is given) on ``target`` with known
    members and non-members (see the module doc for the parts and modes).

    ``detector_spec`` ({name, preset, options, benchmark}) is how :meth:`FittedDetector.
    build_detector` rebuilds the detector later; ``target_record`` the target's identity
    (:func:`calibdcd.targets.identity.target_record`), checked on load.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not 0 < fpr < 1:
        raise ValueError(f"fpr must be in (0, 1), got {fpr!r}")
    if len(texts.heldout) < 1 / fpr - 1:
        warnings.warn(
            f"{len(texts.heldout)} held-out non-members cannot resolve fpr {fpr}: no score "
            f"can be declared a member (needs at least {int(np.ceil(1 / fpr - 1))})",
            RuntimeWarning,
            stacklevel=2,
        )
    fitted_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    pool = texts.fit_pool(mode)
    adapter = DetectorAdapter(detector)
    say = _Steps(status, int(adapter.pool_trained) + _pipeline_steps(views, calibration) + 1)
    if adapter.pool_trained:
        say(f"training the learnt parts on {_texts_n(len(pool), 'unlabelled fit-pool text')}")
    served0, empty0 = completion_counts(target)
    _use_nonmembers(detector, texts)
    _prepare(detector, target, pool, mode)
    fit = _fit_pipeline(
        detector, target, texts, pool, views=views, calibration=calibration, space=space,
        seed=seed, say=say,
    )  # fmt: skip
    completions = _completions_record(target, served0, empty0, "the fitted detector")
    say(
        "cross-validating the fit on the supervised texts' features (no model query), "
        "how well it separates known texts it did not train on"
    )
    separation = _separation(fit, calibration is not None, adapter, seed)
    if fit.null.size >= 1 / fpr - 1:  # fewer: warned above, no member can be declared
        _warn_fpr_budget(int(fit.null.size), len(texts.heldout), fpr)
    learnt = _learnt_parts(detector, target, pool) if mode == "inductive" else {}
    spec = dict(detector_spec or {"name": detector.name, "preset": None, "options": {}})
    return FittedDetector(
        scorer=fit.scorer,
        null=fit.null,
        fpr=float(fpr),
        mode=mode,
        seed=int(seed),
        detector_spec=spec,
        target=dict(target_record or {}),
        texts=texts,
        blocks=fit.blocks,
        block=fit.block,
        views=list(views),
        calibration_config=calibration,
        space_requested=space,
        generation={**fit.generation, "completions": completions},
        sizes=fit.sizes,
        learnt=learnt,
        versions=package_versions(),
        separation=separation,
        fitted_at=fitted_at,
    )


def _separation(fit: _Fit, calibdcd: bool, adapter: DetectorAdapter, seed: int) -> dict[str, Any]:
    """The fit's :func:`~calibdcd.fitted.audit.cross_validated_separation` (the whole pipeline
    refitted per fold on the already extracted features), warned when it does not beat chance."""
    assert fit.refit is not None and fit.z_sup is not None and fit.y_sup is not None
    refit = fit.refit

    def fold(z: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        return refit(z, y).score

    what = "the classifier, CalibDCD and the retrained classifier" if calibdcd else "the classifier"
    sep = cross_validated_separation(
        fit.z_sup, fit.y_sup, fold, min_train_per_class=adapter.min_supervised_per_class,
        seed=seed, what=what,
    )  # fmt: skip
    if sep.warning:
        warnings.warn(sep.warning, RuntimeWarning, stacklevel=3)
    return {**sep.as_dict(), "calibdcd": calibdcd}
