"""One setting (benchmark x target x detector x seed) end to end.

``run_setting`` does, in order:

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
   everything else. A detector's ``generation`` record (what the target decoded with, per kind
   of query) is kept with its features and written to ``result.json``;
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from calibdcd.atomic import atomic_write_text
from calibdcd.calibration import Calibration, no_correction_reason
from calibdcd.detectors.adapter import DetectorAdapter
from calibdcd.detectors.base import (
    block_columns,
    decoding_record,
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
from calibdcd.experiment.benchmarks import entry_benchmark_name, load_benchmark_entry
from calibdcd.experiment.config import (
    BenchmarkEntry,
    DetectorEntry,
    ExperimentConfig,
    TargetEntry,
    labs_of,
)
from calibdcd.experiment.detectors import (
    DETECTORS,
    PlannedDetector,
    detector_fingerprint,
    plan_detector,
)
from calibdcd.experiment.labs import unbuilt_clean_references
from calibdcd.experiment.rundir import record_setting_digests, verify_setting
from calibdcd.experiment.store import ArrayCache, digest, write_csv, write_json
from calibdcd.experiment.targets import build_target, model_path, target_identity, target_views
from calibdcd.keys import key_dict
from calibdcd.metrics import Interval, TprAtFpr, auc, bootstrap_ci, tpr_at_fpr
from calibdcd.paths import cache_root, strip_locations
from calibdcd.provenance import build_environment, library_versions
from calibdcd.redact import redact_tree
from calibdcd.results import (
    RESULT_SCHEMA_VERSION,
    SettingResult,
    read_result,
    write_result,
)
from calibdcd.targets.recording import RecordingTarget

if TYPE_CHECKING:
    from calibdcd.experiment.plan import RunPlan

__all__ = [
    "PreparedSetting",
    "RunContext",
    "Setting",
    "inputs_hash",
    "prepare_setting",
    "run_analyses",
    "run_setting",
    "setting_hash",
]

RESULT = "result.json"
#: ``--log-samples``: every completion the setting's features used, one JSON line per prompt
SAMPLES = "samples.jsonl"


@dataclasses.dataclass(frozen=True)
class Setting:
    benchmark: BenchmarkEntry
    target: TargetEntry
    detector: DetectorEntry
    seed: int

    @property
    def id(self) -> str:
        return f"{self.benchmark.label}__{self.target.name}__{self.detector.label}__s{self.seed}"


def _portable(value: Any) -> Any:
    """``value`` with every absolute path replaced by its file name: a hash of it is the same in
    every checkout (the files' contents are in :func:`inputs_hash`)."""
    return strip_locations(value)


def _setting_hash(setting: Setting, cfg: ExperimentConfig) -> str:
    """Everything a setting's result depends on (a changed config recomputes the setting).
    Absolute paths enter as their file names only, so the hash does not depend on where the
    checkout, the data or the cache live."""
    return digest(
        _portable(key_dict(setting)),  # fields added since at their old value: left out
        cfg.protocol,
        cfg.n_supervised_per_class,
        cfg.calibration_fraction,
        cfg.n_calibration,
        cfg.balance,
        cfg.group_by,
        cfg.detector_seed,
        cfg.calibration.kwargs(),
        dataclasses.asdict(cfg.evaluation),
        dataclasses.asdict(cfg.analyses),
        cfg.view_system,
        cfg.calibration_space,
        # (only when set, so that the hashes of configs without it stay as they were)
        *(() if cfg.subsample_seed is None else (("subsample_seed", cfg.subsample_seed),)),
    )[:16]


setting_hash = _setting_hash


def inputs_hash(
    setting: Setting, cfg: ExperimentConfig, ctx: RunContext, shash: str | None = None
) -> str:
    """What the config does not pin down: the resolved detector (e.g. the path of a lab's clean
    reference LM, whose cache key carries its build format), the target's checkpoint files and
    the benchmark's texts and labels. A stored result is reused only when these match too, so a
    rebuilt lab or reference model is never hidden behind an old result.

    Never builds anything: when a lab the setting uses is not built here (its
    :class:`~calibdcd.experiment.config.LabRef`, resolved when the config was loaded, says so),
    no stored result can be current and the hash names the missing lab's content key; the
    same for a lab's clean reference LM (DPDLLM) that is not trained here."""
    labs = labs_of(cfg, setting.benchmark, setting.target, setting.detector)
    missing = [r.key for r in labs if not r.built]
    if missing:
        return "lab-not-built:" + ",".join(missing)
    untrained = unbuilt_clean_references(dict(setting.detector.options), root=ctx.cache_root)
    if untrained:
        return "reference-not-built:" + ",".join(untrained)
    det = ctx.detector(setting.detector, ctx.benchmark_name(setting.benchmark), setting.seed)
    return digest(
        shash if shash is not None else _setting_hash(setting, cfg),
        ctx.detector_key(det),
        ctx.target_key(setting.target),
        ctx.benchmark_digest(setting.benchmark),
    )[:16]


class RunContext:
    """Loaded benchmarks, detectors and (at most one) target, shared across a run's settings."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        *,
        progress: bool = True,
        log_samples: bool = False,
        plan: RunPlan | None = None,
    ):
        self.cfg = cfg
        #: the run's plan (:func:`calibdcd.experiment.plan.resolve`): the detectors' options
        #: and the benchmarks' names come from it; without one they are resolved here
        self.plan = plan
        self._planned: dict[tuple[str, str, int], PlannedDetector] = {}
        #: keep every completion a setting's features used (``settings/<id>/samples.jsonl``)
        self.log_samples = log_samples
        #: the run start's commit, dirty flag and host (:func:`calibdcd.provenance.
        #: setting_provenance`), recorded in each result computed here; None outside a run
        self.provenance: dict[str, Any] | None = None
        self.cache_root = cache_root(cfg.cache_dir)  # labs and everything built live here
        self.arrays = ArrayCache(self.cache_root)
        self.progress = progress
        self._benchmarks: dict[str, Any] = {}
        self._benchmark_digests: dict[str, str] = {}
        self._detectors: dict[tuple[str, str, int], Any] = {}
        self._target: tuple[str, Any] | None = None
        self._views: dict[str, list[Any]] = {}
        self._target_keys: dict[tuple[str, str, bool], str] = {}
        self._detector_keys: dict[int, tuple[Any, str]] = {}
        self.target_loads = 0

    def target_key(self, entry: TargetEntry) -> str:
        """The feature cache's identity of a target (its checkpoint's content, not where it
        lives), computed once per run and model: the setting's ``inputs_hash`` and its feature
        keys use this one value. Keyed on where the model is and whether it is there yet, so a
        lab built after a first ask (a context used outside ``run_experiment``, which builds
        every lab first) gets its identity computed again."""
        where = model_path(entry, build_lab=False, root=self.cache_root)
        key = (entry.name, where, Path(where).exists())
        if key not in self._target_keys:
            self._target_keys[key] = target_identity(entry, where, self.cache_root)
        return self._target_keys[key]

    def detector_key(self, detector: Any) -> str:
        """A detector's fingerprint (:func:`~calibdcd.experiment.detectors.
        detector_fingerprint`), computed once per detector object of this run."""
        hit = self._detector_keys.get(id(detector))
        if hit is None or hit[0] is not detector:
            hit = (detector, detector_fingerprint(detector, self.cache_root))
            self._detector_keys[id(detector)] = hit
        return hit[1]

    def benchmark(self, entry: BenchmarkEntry) -> Any:
        if entry.label not in self._benchmarks:
            bench = load_benchmark_entry(entry, root=self.cache_root, progress=self.progress)
            if bench.name != self.benchmark_name(entry):  # the plan's detectors use that name
                raise RuntimeError(
                    f"benchmark {entry.label}: loaded as {bench.name!r}, planned as "
                    f"{self.benchmark_name(entry)!r} (a bug: please report it)"
                )
            self._benchmarks[entry.label] = bench
        return self._benchmarks[entry.label]

    def benchmark_digest(self, entry: BenchmarkEntry) -> str:
        """A digest of the benchmark's texts, labels and text ids (computed once per run): a
        renamed id changes it, so ``scores.csv`` never keeps an old id."""
        if entry.label not in self._benchmark_digests:
            bench = self.benchmark(entry)
            self._benchmark_digests[entry.label] = digest(
                list(bench.texts), [int(y) for y in bench.labels], [s.id for s in bench.samples]
            )
        return self._benchmark_digests[entry.label]

    def benchmark_name(self, entry: BenchmarkEntry) -> str:
        """The name ``entry``'s benchmark loads under (what its detectors are configured for),
        from the plan when there is one; nothing is read."""
        if self.plan is not None:
            return self.plan.benchmark_name(entry)
        return entry_benchmark_name(entry)

    def planned_detector(
        self, entry: DetectorEntry, benchmark_name: str, seed: int = 0
    ) -> PlannedDetector:
        """The detector of ``entry`` for one benchmark and setting seed as the plan resolved it
        (:func:`~calibdcd.experiment.detectors.plan_detector`; resolved here, once, for a
        setting the context has no plan of)."""
        if self.cfg.detector_seed == "fixed":
            seed = 0
        key = (entry.label, benchmark_name, seed)
        hit = self.plan.detectors.get(key) if self.plan is not None else None
        if hit is None:  # a setting outside the plan (another shard's, a context without one)
            hit = self._planned.get(key)
            if hit is None:
                hit = plan_detector(
                    entry, benchmark_name, seed, str(self.cache_root),
                    detector_seed=self.cfg.detector_seed,
                )  # fmt: skip
                self._planned[key] = hit
        return hit

    def detector(self, entry: DetectorEntry, benchmark_name: str, seed: int = 0) -> Any:
        """The detector of ``entry`` for one benchmark and setting seed, built once per run:
        with ``detector_seed: offset`` every ``seed`` field of its config (sampling,
        perturbation, training) is shifted by the setting seed (seed 0 = the configured
        detector); the plan holds the shifted options."""
        planned = self.planned_detector(entry, benchmark_name, seed)
        if planned.key not in self._detectors:
            self._detectors[planned.key] = planned.build(
                str(self.cache_root), progress=self.progress
            )
        return self._detectors[planned.key]

    def target(self, entry: TargetEntry) -> Any:
        """The cached target (built on first need; the previous one is released)."""
        if self._target is not None and self._target[0] == entry.name:
            return self._target[1]
        self.release_target()
        t = build_target(
            entry, self.cache_root / "generations.sqlite", self.cache_root, progress=self.progress
        )
        self.target_loads += 1
        self._target = (entry.name, t)
        return t

    def release_target(self) -> None:
        if self._target is not None:
            close = getattr(self._target[1], "close", None)
            if callable(close):
                close()
            self._target = None
            import gc

            gc.collect()

    def completion_counts(self, entry: TargetEntry) -> tuple[int, int]:
        """(completions served, empty ones) so far by ``entry``'s target when it is loaded."""
        if self._target is None or self._target[0] != entry.name:
            return 0, 0
        st = getattr(self._target[1], "stats", None)
        return (st.served, st.empty) if st is not None and hasattr(st, "served") else (0, 0)

    def views(self, entry: TargetEntry) -> list[Any]:
        if entry.name not in self._views:
            self._views[entry.name] = target_views(
                entry,
                self.cfg.view_system,
                root=self.cache_root,
                loaded_family=lambda: getattr(self.target(entry), "family", None),
            )
        return self._views[entry.name]


# --------------------------------------------------------------------------------------------
# Features
# --------------------------------------------------------------------------------------------


def _view_id(view: Any | None) -> Any:
    if view is None:
        return "e0"
    return {"code": view.code, "prefix": view.prefix, "suffix": view.suffix}


class _Extractor:
    """Cached feature extraction for one setting."""

    def __init__(self, ctx: RunContext, setting: Setting, detector: Any, pool: list[str]):
        self.ctx = ctx
        self.setting = setting
        self.detector = detector
        self.pool = pool
        self.det_key = ctx.detector_key(detector)
        self.target_key = ctx.target_key(setting.target)
        self.adapter = DetectorAdapter(detector)
        self.takes_reference = self.adapter.takes_reference
        self.has_prepare = self.adapter.pool_trained
        self.blocks: dict[str, slice] | None = None
        self.seconds = 0.0
        self.extracted = 0
        self.steps: dict[str, float] = {}  #: the detector's own per-step seconds, summed
        #: the target's decoding per kind of query (the detector's features' ``generation``)
        self.generation: dict[str, Any] = {}
        #: {kind: GenerationParams} of a detector whose features do not carry the record
        self.kinds: dict[str, Any] = dict(detector.generation_kinds)
        #: every completion the features used (``--log-samples``; empty otherwise)
        self.samples: list[dict[str, Any]] = []

    def __call__(self, texts: list[str], view: Any | None, reference: list[str]) -> np.ndarray:
        key = digest(
            "features/v1",
            self.det_key,
            self.target_key,
            _view_id(view),
            texts,
            reference if self.takes_reference else None,
            self.pool if self.has_prepare else None,
        )
        hit = self.ctx.arrays.load_arrays("features", key, require=("values",))
        if hit is not None and self.ctx.log_samples and "samples" not in hit:
            hit = None  # cached without its completions: extracted again (from the generation
            # cache, so nothing is generated twice) to log them
        if hit is not None:
            if "samples" in hit:
                self.samples.extend(json.loads(str(hit["samples"])))
            self._set_blocks(hit)
            if "generation" in hit:
                self._add_generation(json.loads(str(hit["generation"])))
            elif self.kinds:
                # features cached before runs recorded decoding: what was asked, not what was used
                self._add_generation(
                    {
                        k: {"requested": p.as_dict(), "note": "cached before decoding was recorded"}
                        for k, p in self.kinds.items()
                    }
                )
            return hit["values"]
        t0 = time.perf_counter()
        target = self.ctx.target(self.setting.target)
        recorder = RecordingTarget(target, "prepare") if self.ctx.log_samples else None
        if recorder is not None:
            target = recorder
        before = self.adapter.timings()
        self.adapter.prepare(self.pool, target)
        if recorder is not None:
            recorder.phase = "e0" if view is None else view.code
        feats = self.adapter.extract(texts, target, view, reference)
        # a detector keeps per-step seconds on itself (VeilProbe) or on its features (DPDLLM)
        after = self.adapter.timings()
        spent = {k: float(v) - float(before.get(k, 0.0)) for k, v in after.items()}
        for k, v in (getattr(feats, "timings", None) or {}).items():
            spent[k] = spent.get(k, 0.0) + float(v)
        for k, v in spent.items():
            self.steps[str(k)] = self.steps.get(str(k), 0.0) + v
        values = np.asarray(feats.values, dtype=np.float64)
        names = list(feats.blocks)
        bounds = np.array([[feats.blocks[n].start, feats.blocks[n].stop] for n in names])
        arrays = {"values": values, "block_names": np.array(names), "block_bounds": bounds}
        generation = decoding_record(self.detector, target, feats)
        if generation:
            arrays["generation"] = np.array(json.dumps(generation, sort_keys=True, default=str))
            self._add_generation(generation)
        if recorder is not None:  # kept with the features: a later hit logs them too
            arrays["samples"] = np.array(json.dumps(recorder.records, default=str))
            self.samples.extend(recorder.records)
        self.ctx.arrays.save_arrays("features", key, arrays)
        self._set_blocks(arrays)
        self.seconds += time.perf_counter() - t0
        self.extracted += 1
        return values

    def _add_generation(self, record: dict[str, Any]) -> None:
        for kind, rec in record.items():
            self.generation.setdefault(str(kind), rec)

    def _set_blocks(self, arrays: dict[str, np.ndarray]) -> None:
        if self.blocks is None and "block_names" in arrays:
            self.blocks = {
                str(n): slice(int(a), int(b))
                for n, (a, b) in zip(arrays["block_names"], arrays["block_bounds"], strict=True)
            }


# --------------------------------------------------------------------------------------------
# The setting
# --------------------------------------------------------------------------------------------


def _interval(
    labels: np.ndarray, scores: np.ndarray, metric: Callable, cfg: ExperimentConfig, seed: int
) -> dict:
    ev = cfg.evaluation
    if ev.n_boot == 0:
        v = float(metric(labels, scores))
        return {"estimate": v, "low": None, "high": None, "level": ev.level, "n_boot": 0}
    iv: Interval = bootstrap_ci(labels, scores, metric, n_boot=ev.n_boot, level=ev.level, seed=seed)
    return iv.as_dict()


@dataclasses.dataclass
class PreparedSetting:
    """A setting after the data protocol, feature extraction and the original classifier: the
    :class:`CalibrationProblem` plus what the result files need."""

    setting: Setting
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


def split_config(benchmark: BenchmarkEntry, cfg: ExperimentConfig) -> Any:
    """The data protocol's settings for ``benchmark`` under ``cfg``."""
    from calibdcd.data import SplitConfig

    return SplitConfig(
        protocol=cfg.protocol,
        subsample=benchmark.subsample,  # type: ignore[arg-type]
        balance=cfg.balance,
        n_supervised_per_class=cfg.n_supervised_per_class,
        calibration_fraction=cfg.calibration_fraction,
        n_calibration=cfg.n_calibration,
        group_by=cfg.group_by,
        subsample_seed=cfg.subsample_seed,
    )


def prepare_setting(
    setting: Setting,
    cfg: ExperimentConfig,
    ctx: RunContext,
    *,
    status: Callable[[str], None] | None = None,
) -> PreparedSetting:
    """Split, features (from the cache when present; the target is loaded only on a miss) and
    the original classifier of one setting. Re-running it on a complete run queries nothing."""
    from calibdcd.data import split_benchmark

    say = status or (lambda s: None)
    bench = ctx.benchmark(setting.benchmark)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        split = split_benchmark(bench, split_config(setting.benchmark, cfg), seed=setting.seed)
    texts = bench.texts
    labels = np.asarray(bench.labels)
    sup = np.asarray(split.supervised)
    rest = np.setdiff1d(np.asarray(split.subsample), sup)
    cal_idx = np.asarray(split.calibration)
    ev_idx = np.asarray(split.evaluation)
    pos_rest = {int(i): k for k, i in enumerate(rest)}

    detector = ctx.detector(setting.detector, ctx.benchmark_name(setting.benchmark), setting.seed)
    pool = [texts[i] for i in split.subsample]
    ext = _Extractor(ctx, setting, detector, pool)
    sup_texts = [texts[i] for i in sup]
    rest_texts = [texts[i] for i in rest]
    cal_texts = [texts[i] for i in cal_idx]

    ref_sup, ref_rest = sup_texts, rest_texts
    if ext.takes_reference:  # e.g. DPDLLM's shared reference: the subsample
        ref_sup = ext.adapter.reference_texts(sup_texts, pool)
        ref_rest = ext.adapter.reference_texts(rest_texts, pool)

    say("features e0")
    z_sup = ext(sup_texts, None, ref_sup)
    z_rest = ext(rest_texts, None, ref_rest)
    views = ctx.views(setting.target)
    z_views: dict[str, np.ndarray] = {}
    for v in views:
        say(f"features {v.code}")
        z_views[v.code] = ext(cal_texts, v, ref_rest)

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
    seed = setting.seed

    def new_clf() -> Any:
        return detector.new_classifier(seed)

    # the fitting libraries' versions and device are in the key: they can change a fit's bytes
    # (torch's device and threads only for a detector that runs torch: reading them imports it)
    torch_env = DETECTORS[setting.detector.name].uses_torch
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
    clf0 = ctx.arrays.load_model("models", clf_key, clf_type)
    if clf0 is None:
        clf0 = new_clf().fit(z_sup_ok, y_sup)
        ctx.arrays.save_model("models", clf_key, clf0)
    space = resolve_space(clf0, cfg.calibration_space)

    def model_cache(kind: str, cal: Calibration, build: Callable[[], Any]) -> Any:
        centre = () if getattr(cal, "center", None) is None else (cal.center,)
        key = digest(f"{kind}/v1", clf_key, cal.basis, cal.strength, space, *centre)
        m = ctx.arrays.load_model("models", key, clf_type)
        if m is None:
            m = build()
            ctx.arrays.save_model("models", key, m)
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
        fpr=cfg.evaluation.fpr,
        model_cache=model_cache,
    )
    return PreparedSetting(
        setting=setting,
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


def run_analyses(prep: PreparedSetting, main: Outcome, cfg: ExperimentConfig) -> dict[str, Any]:
    """The per-setting analyses of the config (ablations, fixed configuration, FP recovery)."""
    problem, seed, an = prep.problem, prep.setting.seed, cfg.analyses
    out: dict[str, Any] = {}
    if an.ablations:
        abl: dict[str, Any] = {
            name: problem.run(c).summary()
            for name, c in ablation_configs(cfg.calibration, seed).items()
        }
        full = full_correction_config(cfg.calibration, main.calibration)
        abl["fixed_full"] = problem.run(full).summary() if full is not None else None
        out["ablations"] = abl
    if an.adaptive_vs_fixed:
        fixed = problem.run(fixed_config(cfg.calibration, an.fixed_rank, an.fixed_strength))
        out["fixed"] = fixed.summary()
        out["fixed"]["config"] = {"rank": an.fixed_rank, "strength": an.fixed_strength}
    if an.fp_recovery:
        out["fp_recovery"] = fp_recovery(problem, main)
    alt = other_space(problem.original, problem.space) if an.space_comparison else None
    if alt is not None:
        out["space"] = {
            "space": alt,
            **dataclasses.replace(problem, space=alt).run(cfg.calibration).summary(),
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


def run_controls(prep: PreparedSetting, main: Outcome, cfg: ExperimentConfig) -> ControlRun:
    """Placebo, noise floor, centred variant (:func:`analyses.controls`) and the blind baseline,
    with the paired statistics of every "method vs original" on the same pool (one seed here;
    the report pools the seeds)."""
    from calibdcd.stats import MIN_PAIRED_BOOT, compare

    problem, seed, an, ev = prep.problem, prep.setting.seed, cfg.analyses, cfg.evaluation
    y = problem.y_eval
    all_idx = np.concatenate([prep.sup_used, prep.rest_used])
    z_all = np.concatenate([problem.z_sup, prep.z_rest_used])
    pool_scores: dict[str, np.ndarray] = {"calibdcd": main.scores}
    summaries: dict[str, Any] = {}
    text_scores: dict[str, dict[int, float]] = {}
    if an.controls:
        for name, ctl in controls(
            problem, main, cfg.calibration, fixed_rank=an.fixed_rank,
            fixed_strength=an.fixed_strength, seed=seed,
        ).items():  # fmt: skip
            out = ctl.outcome
            summary = out.summary()
            if name not in VARIANTS:  # no calibration of their own: no views, no objective
                summary.pop("selected_views")
                summary.pop("best_objective")
            else:
                summary["reason"] = no_correction_reason(out.calibration)
            summaries[name] = {**summary, **ctl.extra, "label": CONTROLS[name]}
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
            "tpr": tpr_at_fpr(y, s_pool, cfg.evaluation.fpr),
        }
        pool_scores["blind"] = s_pool

    def paired(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
        n_boot = max(ev.n_boot, MIN_PAIRED_BOOT)
        res = compare([(y, a, b)], fpr=cfg.evaluation.fpr, n_boot=n_boot, level=ev.level, seed=seed)
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


def run_setting(
    setting: Setting,
    cfg: ExperimentConfig,
    run_dir: Path,
    ctx: RunContext,
    *,
    status: Callable[[str], None] | None = None,
    setting_hash: str | None = None,
) -> SettingResult:
    """Run one setting (or return its stored result when already complete, ``skipped``).
    ``setting_hash``: the hash the run's plan computed (:mod:`calibdcd.experiment.plan`);
    computed here when None."""
    out = Path(run_dir) / "settings" / setting.id
    shash = setting_hash if setting_hash is not None else _setting_hash(setting, cfg)
    done = out / RESULT
    if done.is_file() and not (ctx.log_samples and not (out / SAMPLES).is_file()):
        try:
            prev = read_result(done)
            if prev.setting_hash == shash and prev.inputs_hash == inputs_hash(
                setting, cfg, ctx, shash
            ):
                verify_setting(out)  # an edited result (digests.json) is recomputed too
                return prev.model_copy(update={"skipped": True})
        except (OSError, ValueError) as exc:  # a damaged result is recomputed, loudly
            warnings.warn(f"{exc}; recomputing the setting", RuntimeWarning, stacklevel=2)
    say = status or (lambda s: None)
    t_start = time.perf_counter()
    served0, empty0 = ctx.completion_counts(setting.target)
    prep = prepare_setting(setting, cfg, ctx, status=say)
    served1, empty1 = ctx.completion_counts(setting.target)
    problem, seed = prep.problem, setting.seed
    say("calibration")
    main = problem.run(cfg.calibration)
    fpr = cfg.evaluation.fpr

    tpr = TprAtFpr(fpr)  # one object: the bootstrap scores its resamples at once
    y_eval = problem.y_eval
    before = {
        "auc": _interval(y_eval, problem.scores_before, auc, cfg, seed),
        "tpr": _interval(y_eval, problem.scores_before, tpr, cfg, seed),
    }
    after = {
        "auc": _interval(y_eval, main.scores, auc, cfg, seed),
        "tpr": _interval(y_eval, main.scores, tpr, cfg, seed),
    }
    say("analyses")
    analyses = run_analyses(prep, main, cfg)
    say("controls")
    ctl = run_controls(prep, main, cfg)

    # per-text scores: every kept text of the subsample, its part, and both detectors' scores
    final = problem.final_scorer(main.calibration, main.classifier)
    bench, split = prep.benchmark, prep.split
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
    write_csv(
        out / "scores.csv",
        ["id", "label", "part", "in_pool", "calibration", "score_before", "score_after"]
        + [CONTROL_COLUMNS[c] for c in extra],
        rows,
    )
    write_json(out / "split.json", split.to_dict())

    result = {
        "schema_version": RESULT_SCHEMA_VERSION,
        "id": setting.id,
        "setting_hash": shash,
        "inputs_hash": inputs_hash(setting, cfg, ctx, shash),
        "benchmark": setting.benchmark.label,
        "benchmark_name": bench.name,
        "target": setting.target.name,
        "target_family": setting.target.family,
        "post_trained": setting.target.post_trained,
        "base": setting.target.base,
        "detector": setting.detector.label,
        "detector_name": setting.detector.name,
        "seed": seed,
        "protocol": cfg.protocol,
        "sizes": {
            "supervised": [len(problem.y_sup), int(problem.y_sup.sum())],
            "calibration": [len(problem.z_cal), 0],
            "evaluation": [len(y_eval), int(y_eval.sum())],
            "dropped": prep.n_dropped,
            "excluded_by_group": len(split.excluded),
        },
        "feature_dim": prep.feature_dim,
        "block_dim": prep.feature_dim if problem.block is None else len(problem.block),
        "space": problem.space,
        "fpr": fpr,
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
        "provenance": ctx.provenance,
    }
    # the decoding record can quote target options (a secret in extra_body, a URL's password):
    # a run directory never holds a secret (calibdcd.redact)
    typed = SettingResult.model_validate(redact_tree(result))
    for w in typed.warnings:
        warnings.warn(f"{setting.id}: {w}", RuntimeWarning, stacklevel=2)
    if ctx.log_samples:  # before the result: a result without its samples is re-run
        atomic_write_text(
            out / SAMPLES,
            "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in prep.samples),
        )
    write_result(done, typed)
    record_setting_digests(out)  # what the report reads, as written: a merge checks it
    return typed
