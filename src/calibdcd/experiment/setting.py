"""One setting (benchmark x target x detector x seed) end to end, as the run's plan resolved it.

``run_setting(planned, inputs)`` reads everything from its
:class:`~calibdcd.experiment.plan.PlannedSetting` (split, procedure, directory, hash) and the
:class:`~calibdcd.experiment.resources.SettingInputs` the run loaded from it
(:meth:`RunContext.inputs`: benchmark, built detector, identities and inputs hash, the target
and its views on first need, the caches); it resolves and loads nothing itself: the run loads,
the setting computes. It does, in order:

1. the data protocol: :func:`calibdcd.data.split_benchmark` (seeded; ``paper`` or ``strict``);
2. features, each cached on disk under a key of everything it depends on (detector config,
   target identity, view, texts, the detector's reference/pool texts): e0 features of the
   supervised split, e0 features of the rest of the subsample (evaluation pool + calibration
   non-members), and the calibration non-members' features under each of the ten views. Every
   target query goes through the SQLite generation cache; the target is loaded only on a miss.
   Detectors that train on the unlabelled pool (``prepare(pool, target)``: VeilProbe's mapping
   model) get the whole subsample first; detectors whose ``extract`` takes ``reference_texts``
   (DPDLLM's reference LM) get, per part, ``detector.reference_texts_for(part texts, subsample)``
   when they have it (DPDLLM: the whole subsample when ``reference.arrangement`` is ``shared``),
   else the supervised texts for the supervised split and the rest of the subsample for
   everything else. Detectors that need known non-members (ReCaLL's prefix) get the supervised
   split's non-members before any extraction: labelled, and never in the evaluation pool under
   either protocol (the calibration non-members are, under ``paper``). A detector's
   ``generation`` record (what the target decoded with, per kind of query) is kept with its
   features and written to ``result.json``;
3. the original classifier on the supervised split (cached), CalibDCD on the calibration
   non-members (correctable block = the detector's ``calibration_blocks``), the retrained
   classifier, AUC and TPR@FPR with bootstrap CIs before and after on the evaluation pool;
4. the analyses (:mod:`calibdcd.experiment.analyses`) from the same arrays, the controls
   (placebo, noise floor, centred variant) and the blind baseline (:mod:`calibdcd.blind`), each
   compared with the original detector on the same pool (:func:`calibdcd.stats.compare`);
5. the setting directory: ``scores.csv`` (per text: original, CalibDCD, every control and the
   blind baseline), ``split.json``, and ``result.json`` written atomically last; a setting with
   a ``result.json`` of the same ``setting_hash`` is complete.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from calibdcd.atomic import atomic_write_text, write_csv, write_json
from calibdcd.calibration import Calibration, no_correction_reason
from calibdcd.detectors.base import (
    block_columns,
)
from calibdcd.experiment.analyses import (
    CONTROLS,
    VARIANTS,
    CalibrationProblem,
    Outcome,
    ablation_configs,
    controls,
    fixed_config,
    fp_recovery,
    full_correction_config,
    other_space,
    resolve_space,
)
from calibdcd.experiment.detector_entries import DETECTORS
from calibdcd.experiment.features import FeatureExtractor
from calibdcd.experiment.plan import (
    PlannedSetting,
    Procedure,
)
from calibdcd.experiment.resources import SettingInputs
from calibdcd.experiment.rundir import record_setting_digests, verify_setting
from calibdcd.keys import digest
from calibdcd.metrics import Interval, TprAtFpr, auc, bootstrap_ci, tpr_at_fpr
from calibdcd.provenance import build_environment, library_versions
from calibdcd.redact import redact_tree
from calibdcd.results import (
    RESULT_FILE,
    RESULT_SCHEMA_VERSION,
    SettingResult,
    read_result,
    write_result,
)

__all__ = [
    "PreparedSetting",
    "prepare_setting",
    "run_analyses",
    "run_setting",
]

#: ``--log-samples``: every completion the setting's features used, one JSON line per prompt
SAMPLES = "samples.jsonl"


# --------------------------------------------------------------------------------------------
# The setting
# --------------------------------------------------------------------------------------------


def _interval(labels: np.ndarray, scores: np.ndarray, metric: Callable, ev: Any, seed: int) -> dict:
    if ev.n_boot == 0:
        v = float(metric(labels, scores))
        return {"estimate": v, "low": None, "high": None, "level": ev.level, "n_boot": 0}
    iv: Interval = bootstrap_ci(labels, scores, metric, n_boot=ev.n_boot, level=ev.level, seed=seed)
    return iv.as_dict()


@dataclasses.dataclass
class PreparedSetting:
    """A setting after the data protocol, feature extraction and the original classifier: the
    :class:`CalibrationProblem` plus what the result files need."""

    planned: PlannedSetting
    benchmark: Any
    split: Any
    problem: CalibrationProblem
    views: list[Any]
    sup_used: np.ndarray  #: benchmark indices of the supervised texts kept (finite features)
    rest_used: np.ndarray  #: benchmark indices of the other subsample texts kept
    z_rest_used: np.ndarray
    eval_used: np.ndarray  #: benchmark indices of the evaluation pool, in problem row order
    n_dropped: int
    feature_dim: int
    feature_seconds: float
    extractions: int
    #: wall seconds per step of the detector's own ``timings`` (when it keeps them) spent here
    detector_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    #: the target's decoding per kind of detector query (detectors.base.decoding_record)
    generation: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: every completion the features used, one record per prompt (``--log-samples``)
    samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _features(
    inputs: SettingInputs, split: Any, say: Callable[[str], None]
) -> tuple[FeatureExtractor, np.ndarray, np.ndarray, list[Any], dict[str, np.ndarray]]:
    """The setting's features (cached): e0 of the supervised texts and of the rest of the
    subsample, and the calibration non-members' under each view; with the extractor. A detector
    that needs known non-members gets the supervised split's first (never an evaluation text)."""
    texts = inputs.benchmark.texts
    sup = np.asarray(split.supervised)
    rest = np.setdiff1d(np.asarray(split.subsample), sup)
    pool = [texts[i] for i in split.subsample]
    ext = FeatureExtractor(inputs, pool)
    sup_labels = np.asarray(inputs.benchmark.labels)[sup]
    ext.use_nonmembers([texts[i] for i in sup[sup_labels == 0]])
    sup_texts = [texts[i] for i in sup]
    rest_texts = [texts[i] for i in rest]
    cal_texts = [texts[i] for i in np.asarray(split.calibration)]
    ref_sup, ref_rest = sup_texts, rest_texts
    if ext.takes_reference:  # e.g. DPDLLM's shared reference: the subsample
        ref_sup = ext.adapter.reference_texts(sup_texts, pool)
        ref_rest = ext.adapter.reference_texts(rest_texts, pool)
    say("features e0")
    z_sup = ext(sup_texts, None, ref_sup)
    z_rest = ext(rest_texts, None, ref_rest)
    views = inputs.views()
    z_views: dict[str, np.ndarray] = {}
    for v in views:
        say(f"features {v.code}")
        z_views[v.code] = ext(cal_texts, v, ref_rest)
    return ext, z_sup, z_rest, views, z_views


def prepare_setting(
    planned: PlannedSetting,
    inputs: SettingInputs,
    *,
    status: Callable[[str], None] | None = None,
) -> PreparedSetting:
    """Split, features (from the cache when present; the target is loaded only on a miss) and
    the original classifier of one setting (``inputs``: :meth:`RunContext.inputs` of it).
    Re-running it on a complete run queries nothing."""
    from calibdcd.data import split_benchmark

    say = status or (lambda s: None)
    bench = inputs.benchmark
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        split = split_benchmark(bench, planned.split, seed=planned.seed)
    labels = np.asarray(bench.labels)
    sup = np.asarray(split.supervised)
    rest = np.setdiff1d(np.asarray(split.subsample), sup)
    cal_idx = np.asarray(split.calibration)
    ev_idx = np.asarray(split.evaluation)
    pos_rest = {int(i): k for k, i in enumerate(rest)}

    detector = inputs.detector
    ext, z_sup, z_rest, views, z_views = _features(inputs, split, say)

    # rows with missing features (e.g. a failed generation recorded as a gap) are dropped
    ok_rest = np.all(np.isfinite(z_rest), axis=1)
    cal_rows = np.array([pos_rest[int(i)] for i in cal_idx], dtype=np.intp)
    ok_cal = ok_rest[cal_rows].copy()
    for zv in z_views.values():
        ok_cal &= np.all(np.isfinite(zv), axis=1)
    ok_sup = np.all(np.isfinite(z_sup), axis=1)
    z_cal = z_rest[cal_rows][ok_cal]
    z_views = {k: v[ok_cal] for k, v in z_views.items()}
    ev_rows = np.array([pos_rest[int(i)] for i in ev_idx], dtype=np.intp)
    ev_keep = ok_rest[ev_rows]
    z_eval, y_eval = z_rest[ev_rows][ev_keep], labels[ev_idx][ev_keep]
    z_sup_ok, y_sup = z_sup[ok_sup], labels[sup][ok_sup]

    say("classifier")
    seed = planned.seed

    def new_clf() -> Any:
        return detector.new_classifier(seed)

    # the fitting libraries' versions and device are in the key: they can change a fit's bytes
    # (torch's device and threads only for a detector that runs torch: reading them imports it)
    torch_env = DETECTORS[planned.setting.detector.name].uses_torch
    clf_key = digest(
        "classifier/v1",
        ext.det_key,
        z_sup_ok,
        y_sup,
        seed,
        *([build_environment(None)] if torch_env else []),
        library_versions(("numpy", "scipy", "scikit-learn")),
    )
    clf_type = type(new_clf())
    arrays = inputs.arrays
    clf0 = arrays.load_model("models", clf_key, clf_type)
    if clf0 is None:
        clf0 = new_clf().fit(z_sup_ok, y_sup)
        arrays.save_model("models", clf_key, clf0)
    space = resolve_space(clf0, planned.procedure.calibration_space)

    def model_cache(kind: str, cal: Calibration, build: Callable[[], Any]) -> Any:
        centre = () if getattr(cal, "center", None) is None else (cal.center,)
        key = digest(f"{kind}/v1", clf_key, cal.basis, cal.strength, space, *centre)
        m = arrays.load_model("models", key, clf_type)
        if m is None:
            m = build()
            arrays.save_model("models", key, m)
        return m

    block = block_columns(ext.blocks, detector.calibration_blocks)
    problem = CalibrationProblem(
        z_sup=z_sup_ok,
        y_sup=y_sup,
        z_eval=z_eval,
        y_eval=y_eval,
        z_cal=z_cal,
        views=z_views,
        original=clf0,
        new_classifier=new_clf,
        block=block,
        space=space,
        fpr=planned.procedure.evaluation.fpr,
        model_cache=model_cache,
    )
    return PreparedSetting(
        planned=planned,
        benchmark=bench,
        split=split,
        problem=problem,
        views=views,
        sup_used=sup[ok_sup],
        rest_used=rest[ok_rest],
        z_rest_used=z_rest[ok_rest],
        eval_used=ev_idx[ev_keep],
        n_dropped=int((~ok_sup).sum() + (~ok_rest).sum()),
        feature_dim=int(z_sup.shape[1]),
        feature_seconds=ext.seconds,
        extractions=ext.extracted,
        detector_seconds={k: round(v, 3) for k, v in ext.steps.items()},
        generation=ext.generation,
        samples=ext.samples,
    )


def run_analyses(prep: PreparedSetting, main: Outcome, proc: Procedure) -> dict[str, Any]:
    """The per-setting analyses of the config (ablations, fixed configuration, FP recovery)."""
    problem, seed, an = prep.problem, prep.planned.seed, proc.analyses
    out: dict[str, Any] = {}
    if an.ablations:
        abl: dict[str, Any] = {
            name: problem.run(c).summary()
            for name, c in ablation_configs(proc.calibration, seed).items()
        }
        full = full_correction_config(proc.calibration, main.calibration)
        abl["fixed_full"] = problem.run(full).summary() if full is not None else None
        out["ablations"] = abl
    if an.adaptive_vs_fixed:
        fixed = problem.run(fixed_config(proc.calibration, an.fixed_rank, an.fixed_strength))
        out["fixed"] = fixed.summary()
        out["fixed"]["config"] = {"rank": an.fixed_rank, "strength": an.fixed_strength}
    if an.fp_recovery:
        out["fp_recovery"] = fp_recovery(problem, main)
    alt = other_space(problem.original, problem.space) if an.space_comparison else None
    if alt is not None:
        out["space"] = {
            "space": alt,
            **dataclasses.replace(problem, space=alt).run(proc.calibration).summary(),
        }
    return out


#: below this many texts in the evaluation pool an AUC is too noisy to report without a warning
MIN_POOL = 20


def reliability_warnings(n_pool: int, served: int, empty: int, auc_after: float) -> list[str]:
    """Loud warnings for results that look fine but are not: a tiny pool, empty completions."""
    out = []
    if n_pool < MIN_POOL:
        out.append(
            f"the evaluation pool has only {n_pool} texts (< {MIN_POOL}): AUC {auc_after:.3f} "
            "is mostly noise"
        )
    from calibdcd.targets.cache import empty_completions_warning  # fit and score's check too

    said = empty_completions_warning(served, empty, measures=f"AUC {auc_after:.3f}")
    return out + ([said] if said else [])


#: scores.csv column of each per-text score besides the original and CalibDCD
CONTROL_COLUMNS = {name: f"score_{name}" for name in (*CONTROLS, "blind")}


@dataclasses.dataclass
class ControlRun:
    """The controls and blind baseline of one setting: summaries, paired comparisons with the
    original detector, and per-text scores for ``scores.csv`` (keyed by benchmark index)."""

    summaries: dict[str, Any]
    paired: dict[str, Any]
    text_scores: dict[str, dict[int, float]]


def run_controls(prep: PreparedSetting, main: Outcome, proc: Procedure) -> ControlRun:
    """Placebo, noise floor, centred variant (:func:`analyses.controls`) and the blind baseline,
    with the paired statistics of every "method vs original" on the same pool (one seed here;
    the report pools the seeds)."""
    from calibdcd.stats import MIN_PAIRED_BOOT, compare

    problem, seed, an, ev = prep.problem, prep.planned.seed, proc.analyses, proc.evaluation
    y = problem.y_eval
    all_idx = np.concatenate([prep.sup_used, prep.rest_used])
    z_all = np.concatenate([problem.z_sup, prep.z_rest_used])
    pool_scores: dict[str, np.ndarray] = {"calibdcd": main.scores}
    summaries: dict[str, Any] = {}
    text_scores: dict[str, dict[int, float]] = {}
    if an.controls:
        # a score-only detector's classifier learns nothing: no noise floor to measure
        score_only = DETECTORS[prep.planned.setting.detector.name].score_only
        for name, ctl in controls(
            problem, main, proc.calibration, fixed_rank=an.fixed_rank,
            fixed_strength=an.fixed_strength, seed=seed,
            noise_floor=None if score_only else an.noise_floor, level=ev.level,
        ).items():  # fmt: skip
            out = ctl.outcome
            summary = out.summary()
            if name not in VARIANTS:  # no calibration of their own: no views, no objective
                summary.pop("selected_views")
                summary.pop("best_objective")
            else:
                summary["reason"] = no_correction_reason(out.calibration)
            summaries[name] = {**summary, **ctl.extra, "label": CONTROLS[name]}
            if ctl.scorer is None:  # an interval around the detector: no scores of its own
                continue
            pool_scores[name] = out.scores
            s_all = ctl.scorer(z_all)
            text_scores[name] = dict(zip(all_idx.tolist(), s_all.tolist(), strict=True))
    if an.blind:
        from calibdcd.blind import BLIND_LABEL, blind_scores

        texts, labels = prep.benchmark.texts, np.asarray(prep.benchmark.labels)
        scored = np.concatenate([prep.sup_used, prep.rest_used])
        s_all = blind_scores(
            [texts[i] for i in prep.sup_used], labels[prep.sup_used],
            [texts[i] for i in scored], seed=seed,
        )  # fmt: skip
        by_idx = dict(zip(scored.tolist(), s_all.tolist(), strict=True))
        text_scores["blind"] = by_idx
        s_pool = np.array([by_idx[int(i)] for i in prep.eval_used])
        summaries["blind"] = {
            "label": BLIND_LABEL,
            "auc": auc(y, s_pool),
            "tpr": tpr_at_fpr(y, s_pool, ev.fpr),
        }
        pool_scores["blind"] = s_pool

    def paired(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
        n_boot = max(ev.n_boot, MIN_PAIRED_BOOT)
        res = compare([(y, a, b)], fpr=ev.fpr, n_boot=n_boot, level=ev.level, seed=seed)
        return {k: v.as_dict() for k, v in res.items()}

    before = problem.scores_before
    comparisons: dict[str, Any] = {}
    for name, s in pool_scores.items():
        if name == "blind":
            comparisons["original_vs_blind"] = paired(before, s)
            comparisons["calibdcd_vs_blind"] = paired(main.scores, s)
        else:
            comparisons[f"{name}_vs_original"] = paired(s, before)
    if "placebo" in pool_scores:
        comparisons["calibdcd_vs_placebo"] = paired(main.scores, pool_scores["placebo"])
    return ControlRun(summaries=summaries, paired=comparisons, text_scores=text_scores)


def _stored(planned: PlannedSetting, inputs_key: str, log_samples: bool) -> SettingResult | None:
    """The setting's stored result when it is complete and current (same setting and inputs
    hashes, digests as written, samples when asked for), else None."""
    out = planned.directory
    done = out / RESULT_FILE
    if not done.is_file() or (log_samples and not (out / SAMPLES).is_file()):
        return None
    try:
        prev = read_result(done)
        if prev.setting_hash == planned.setting_hash and prev.inputs_hash == inputs_key:
            verify_setting(out)  # an edited result (digests.json) is recomputed too
            return prev.model_copy(update={"skipped": True})
    except (OSError, ValueError) as exc:  # a damaged result is recomputed, loudly
        warnings.warn(f"{exc}; recomputing the setting", RuntimeWarning, stacklevel=3)
    return None


def _text_rows(prep: PreparedSetting, main: Outcome, ctl: ControlRun) -> tuple[list, list]:
    """``scores.csv``: every kept text of the subsample, its part, and every detector's score
    (original, CalibDCD, each control, the blind baseline); (header, rows)."""
    problem, bench, split = prep.problem, prep.benchmark, prep.split
    final = problem.final_scorer(main.calibration, main.classifier)
    labels = np.asarray(bench.labels)
    all_idx = np.concatenate([prep.sup_used, prep.rest_used])
    z_all = np.concatenate([problem.z_sup, prep.z_rest_used])
    s_before = np.asarray(problem.original.score(z_all), dtype=np.float64)
    s_after = final(z_all)
    cal_set = set(np.asarray(split.calibration).tolist())
    ev_set = set(prep.eval_used.tolist())
    sup_set = set(prep.sup_used.tolist())
    rows = []
    extra = [c for c in CONTROL_COLUMNS if c in ctl.text_scores]
    for i, b, a in zip(all_idx, s_before, s_after, strict=True):
        i = int(i)
        part = "supervised" if i in sup_set else ("evaluation" if i in ev_set else "calibration")
        rows.append(
            [
                bench.samples[i].id,
                int(labels[i]),
                part,
                int(i in ev_set),
                int(i in cal_set),
                float(b),
                float(a),
                *(float(ctl.text_scores[c][i]) for c in extra),
            ]
        )
    header = ["id", "label", "part", "in_pool", "calibration", "score_before", "score_after"]
    return header + [CONTROL_COLUMNS[c] for c in extra], rows


def run_setting(
    planned: PlannedSetting,
    inputs: SettingInputs,
    *,
    status: Callable[[str], None] | None = None,
) -> SettingResult:
    """Run one planned setting (or return its stored result when already complete,
    ``skipped``) into its directory, from what the run loaded for it (``inputs``:
    :meth:`RunContext.inputs` of the setting). Everything it needs comes resolved from the
    plan."""
    if planned.awaiting is not None:  # (a plan a run materialised has everything built)
        raise ValueError(f"setting {planned.id}: {planned.awaiting}")
    inputs_key = inputs.inputs_hash
    stored = _stored(planned, inputs_key, inputs.log_samples)
    if stored is not None:
        return stored
    say = status or (lambda s: None)
    setting, proc, seed, out = planned.setting, planned.procedure, planned.seed, planned.directory
    t_start = time.perf_counter()
    served0, empty0 = inputs.completion_counts()
    prep = prepare_setting(planned, inputs, status=say)
    served1, empty1 = inputs.completion_counts()
    problem = prep.problem
    say("calibration")
    main = problem.run(proc.calibration)
    ev = proc.evaluation
    tpr = TprAtFpr(ev.fpr)  # one object: the bootstrap scores its resamples at once
    y_eval = problem.y_eval
    before = {
        "auc": _interval(y_eval, problem.scores_before, auc, ev, seed),
        "tpr": _interval(y_eval, problem.scores_before, tpr, ev, seed),
    }
    after = {
        "auc": _interval(y_eval, main.scores, auc, ev, seed),
        "tpr": _interval(y_eval, main.scores, tpr, ev, seed),
    }
    say("analyses")
    analyses = run_analyses(prep, main, proc)
    say("controls")
    ctl = run_controls(prep, main, proc)
    write_csv(out / "scores.csv", *_text_rows(prep, main, ctl))
    write_json(out / "split.json", prep.split.to_dict())
    target = setting.target
    result = {
        "schema_version": RESULT_SCHEMA_VERSION,
        "id": setting.id,
        "setting_hash": planned.setting_hash,
        "inputs_hash": inputs_key,
        "benchmark": setting.benchmark.label,
        "benchmark_name": prep.benchmark.name,
        "target": target.name,
        "target_family": target.family,
        "post_trained": target.post_trained,
        "base": target.base,
        "detector": setting.detector.label,
        "detector_name": setting.detector.name,
        "seed": seed,
        "protocol": proc.protocol,
        "sizes": {
            "supervised": [len(problem.y_sup), int(problem.y_sup.sum())],
            "calibration": [len(problem.z_cal), 0],
            "evaluation": [len(y_eval), int(y_eval.sum())],
            "dropped": prep.n_dropped,
            "excluded_by_group": len(prep.split.excluded),
        },
        "feature_dim": prep.feature_dim,
        "block_dim": prep.feature_dim if problem.block is None else len(problem.block),
        "space": problem.space,
        "fpr": ev.fpr,
        "before": before,
        "after": after,
        "calibration": main.calibration.summary(),
        "analyses": analyses,
        "controls": ctl.summaries,
        "paired": ctl.paired,
        "views": {v.code: v.name for v in prep.views},
        "timings": {
            "total": time.perf_counter() - t_start,
            "features": prep.feature_seconds,
            "detector": prep.detector_seconds,
        },
        "feature_extractions": prep.extractions,
        "warnings": reliability_warnings(
            len(y_eval), served1 - served0, empty1 - empty0, after["auc"]["estimate"]
        ),
        "generation": prep.generation,
        "skipped": False,
        # the start that computed it (commit, dirty flag, host): in no hash
        "provenance": inputs.provenance,
    }
    # the decoding record can quote target options (a secret in extra_body, a URL's password):
    # a run directory never holds a secret (calibdcd.redact)
    typed = SettingResult.model_validate(redact_tree(result))
    for w in typed.warnings:
        warnings.warn(f"{setting.id}: {w}", RuntimeWarning, stacklevel=2)
    if inputs.log_samples:  # before the result: a result without its samples is re-run
        atomic_write_text(
            out / SAMPLES,
            "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in prep.samples),
        )
    write_result(out / RESULT_FILE, typed)
    record_setting_digests(out)  # what the report reads, as written: a merge checks it
    return typed
