"""resolve → materialize → execute: what a run will do, decided once.

:func:`resolve` turns a checked :class:`~calibdcd.experiment.config.ExperimentConfig` into a
frozen :class:`RunPlan` and builds nothing. The plan is the one place a config is worked out:
the run directory and cache root; every setting of the grid (:class:`Setting`) with its hash,
its directory, its benchmark (the name it loads under), its target (the model's path and where
its views come from), its detector (the full parameters with the seed's offsets), its split
protocol and the :class:`Procedure` every setting follows; and every artefact the settings
need that a run builds (a contamination lab, DPDLLM's clean reference LM of a lab): its
identity, where it lives, whether it is built. ``calibdcd run --dry-run`` prints the plan.

What is known only once an artefact is built (a lab model's path, a detector option naming a
lab file) is an explicit "not yet" in the plan (``PlannedTarget.path`` None, a detector's
``problem``, a setting's ``awaiting``). :func:`materialize` is the only code that builds those
artefacts, each under its own file lock (two processes that need the same lab build it once),
and returns the plan with those fields filled. Execution
(:func:`calibdcd.experiment.setting.run_setting`) reads a :class:`PlannedSetting` and resolves
nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from calibdcd.data.benchmarks import benchmark_spec
from calibdcd.experiment.benchmark_entries import entry_benchmark_name, entry_id_field, entry_path
from calibdcd.experiment.config import (
    BenchmarkEntry,
    DetectorEntry,
    ExperimentConfig,
    LabRef,
    TargetEntry,
    entry_labs,
    labs_of,
    option_strings,
)
from calibdcd.experiment.detector_entries import PlannedDetector, plan_detector
from calibdcd.experiment.labs import resolve_lab, resolve_lab_refs, unbuilt_clean_references
from calibdcd.experiment.target_entries import ViewSource, describe_views, model_path, view_source
from calibdcd.keys import digest, key_dict
from calibdcd.paths import cache_root, strip_locations
from calibdcd.results import RESULT_FILE, holds_setting

__all__ = [
    "Artefact",
    "PlannedBenchmark",
    "PlannedDetector",
    "PlannedSetting",
    "PlannedTarget",
    "Procedure",
    "RunPlan",
    "Setting",
    "default_run_dir",
    "detector_seed",
    "grid",
    "materialize",
    "resolve",
    "setting_hash",
    "shard_of",
    "split_config",
]

_CLEAN_REFERENCE = "lab-clean-reference:"


# --------------------------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setting:
    """One point of the grid: benchmark x target x detector x seed (config entries)."""

    benchmark: BenchmarkEntry
    target: TargetEntry
    detector: DetectorEntry
    seed: int

    @property
    def id(self) -> str:
        return f"{self.benchmark.label}__{self.target.name}__{self.detector.label}__s{self.seed}"


def grid(cfg: ExperimentConfig) -> list[Setting]:
    """All settings, target-major (one model load per target), then benchmark, detector, seed."""
    return [
        Setting(b, t, d, s)
        for t in cfg.targets
        for b in cfg.benchmarks
        for d in cfg.detectors
        for s in cfg.seeds
    ]


def shard_of(settings: list, shard: tuple[int, int] | None) -> list:
    """Shard ``i`` of ``n``: the i-th of n contiguous, nearly equal blocks of the grid (target-
    major, so a shard loads few models). Deterministic: the same config gives the same parts
    on every machine, and the n parts are the whole grid."""
    if shard is None:
        return list(settings)
    i, n = shard
    size = len(settings)
    return list(settings[i * size // n : (i + 1) * size // n])


def setting_hash(setting: Setting, cfg: ExperimentConfig) -> str:
    """Everything a setting's result depends on (a changed config recomputes the setting).
    Absolute paths enter as their file names only, so the hash does not depend on where the
    checkout, the data or the cache live (the files' contents are in the setting's inputs
    hash, :func:`calibdcd.experiment.setting.inputs_hash`)."""
    return digest(
        strip_locations(key_dict(setting)),  # fields added since at their old value: left out
        cfg.protocol,
        cfg.n_supervised_per_class,
        cfg.calibration_fraction,
        cfg.n_calibration,
        cfg.balance,
        cfg.group_by,
        cfg.detector_seed,
        cfg.calibration.kwargs(),
        dataclasses.asdict(cfg.evaluation),
        {k: v for k, v in dataclasses.asdict(cfg.analyses).items() if k != "noise_floor"},
        cfg.view_system,
        cfg.calibration_space,
        # (only when set, so that the hashes of configs without it stay as they were)
        *(() if cfg.subsample_seed is None else (("subsample_seed", cfg.subsample_seed),)),
        # (only when not the default: a stored run keeps its hash; its result records the
        # noise floor it computed, ``controls.noise_floor.method``, absent = bootstrap)
        *(() if cfg.analyses.noise_floor == "half_sample" else (("noise_floor", "bootstrap"),)),
    )[:16]


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


def detector_seed(rule: str, seed: int) -> int:
    """The seed a setting's detector is resolved for: the setting seed under
    ``detector_seed: offset``, 0 (the configured detector) under ``fixed``."""
    return 0 if rule == "fixed" else seed


def default_run_dir(cfg: ExperimentConfig) -> Path:
    """Where a run of ``cfg`` writes when no ``--out`` is given: its ``output``, else
    ``runs/<name>``."""
    return Path(cfg.output) if cfg.output else Path("runs") / cfg.name


@dataclasses.dataclass(frozen=True)
class Procedure:
    """What every setting of a run does the same way: the protocol's name, CalibDCD's
    configuration and space, the evaluation, the analyses and the views' system turn."""

    protocol: str
    calibration: Any
    evaluation: Any
    analyses: Any
    calibration_space: str
    view_system: str

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> Procedure:
        return cls(
            cfg.protocol, cfg.calibration, cfg.evaluation, cfg.analyses, cfg.calibration_space,
            cfg.view_system,
        )  # fmt: skip


# --------------------------------------------------------------------------------------------
# What the plan holds
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Artefact:
    """Something a run builds before its settings can run: a lab (``kind="lab"``) or a lab's
    clean reference LM for DPDLLM (``kind="clean reference"``). ``key``: its identity (a lab's
    content key; a reference's option string); ``directory``: where it is or will be (None for
    a reference whose lab is not built yet); ``used_by``: the config entries that need it."""

    kind: str
    spec: str
    key: str
    directory: str | None
    built: bool
    used_by: tuple[str, ...]

    def describe(self) -> str:
        state = "built" if self.built else "to build"
        where = f" at {self.directory}" if self.directory else ""
        users = ", ".join(self.used_by)
        return f"{self.kind} {self.spec} ({self.key}): {state}{where}; used by {users}"


@dataclasses.dataclass(frozen=True)
class PlannedBenchmark:
    """A benchmark of the plan: its entry and the name it loads under (what its detectors are
    configured for, e.g. DPDLLM's per-benchmark settings), known before any file is read."""

    entry: BenchmarkEntry
    name: str
    #: the data protocol's settings for it (:func:`split_config`)
    split: Any = None
    #: the file it is read from (None: a hub dataset or a known benchmark's own source, or
    #: "not yet" while its lab is not built: ``built`` False)
    path: str | None = None
    built: bool = True
    #: the column its texts' ids come from (:func:`~.benchmark_entries.entry_id_field`)
    id_field: str | None = None

    def describe(self) -> str:
        e = self.entry
        if e.hub is not None:
            where = f"hub {e.hub}"
        elif e.lab is not None:
            where = f"lab {e.lab}/{e.path or 'ground_truth.jsonl'}"
        elif e.path:
            where = e.path
        else:
            where = e.name if benchmark_spec(e.name) is None else "its known source"
        return f"benchmark {e.label}: {self.name} from {where}"


@dataclasses.dataclass(frozen=True)
class PlannedTarget:
    """A target of the plan: its entry and its model as resolved without building anything.
    ``path``: the model a run loads (a path inside its built lab, a packaged model's file, or
    the entry's model as given); None while its lab is not built ("not yet": ``materialize``
    fills it) or when it cannot be resolved here (``problem``). ``model``: the same in words."""

    entry: TargetEntry
    model: str
    built: bool
    #: where CalibDCD's views come from, in words (:func:`~.target_entries.describe_views`)
    views: str = ""
    path: str | None = None
    problem: str | None = None
    #: where its views come from, resolved (:func:`~calibdcd.experiment.target_entries.view_source`)
    view_source: ViewSource | None = None

    def describe(self) -> str:
        e = self.entry
        state = "" if self.built else " (its lab is built first)"
        views = f"; views: {self.views}" if self.views else ""
        return f"target {e.name}: {e.backend} {self.model}{state}{views}"


def _planned_benchmark(
    entry: BenchmarkEntry, cfg: ExperimentConfig, root: Path
) -> PlannedBenchmark:
    path = entry_path(entry, build_lab=False, root=root)
    built = entry.lab is None or path is not None
    return PlannedBenchmark(
        entry, entry_benchmark_name(entry), split_config(entry, cfg), path, built,
        entry_id_field(entry, path),
    )  # fmt: skip


def plan_target(entry: TargetEntry, root: Path) -> PlannedTarget:
    """``entry`` as a run plans it under the cache root ``root`` (nothing built or loaded)."""
    if entry.lab is not None:
        lab = resolve_lab(entry.lab, build=False, root=root)
        if lab is None:
            source = view_source(entry, root)
            return PlannedTarget(
                entry, f"lab {entry.lab}/{entry.model}", False, source.words(entry), None, None,
                source,
            )  # fmt: skip
        path = str(lab / entry.model)
        source = view_source(entry, root, path)
        return PlannedTarget(entry, path, True, source.words(entry), path, None, source)
    try:
        path = model_path(entry, build_lab=False, root=root)
    except ValueError as exc:  # a packaged model whose package is not installed
        return PlannedTarget(entry, entry.model, True, describe_views(entry, root), None, str(exc))
    source = view_source(entry, root, path)
    return PlannedTarget(entry, entry.model, True, source.words(entry), path, None, source)


@dataclasses.dataclass(frozen=True)
class PlannedSetting:
    """One setting of the grid as execution reads it: its hash (what its result depends on)
    and directory; the plan's benchmark, target and detector of it (``detector`` None for a
    setting of another shard); its split protocol and the run's procedure; ``awaiting``: what
    it needs that is not built yet (its inputs hash while so), None once everything is."""

    setting: Setting
    setting_hash: str
    directory: Path
    benchmark: PlannedBenchmark | None = None
    target: PlannedTarget | None = None
    detector: PlannedDetector | None = None
    split: Any = None
    procedure: Procedure | None = None
    awaiting: str | None = None

    @property
    def id(self) -> str:
        return self.setting.id

    @property
    def seed(self) -> int:
        return self.setting.seed


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A run, resolved (see the module doc). ``grid``: every setting of the config;
    ``settings``: those this process runs (its shard's part, else all)."""

    config: ExperimentConfig
    run_dir: Path
    cache_root: Path
    artefacts: tuple[Artefact, ...]
    grid: tuple[PlannedSetting, ...]
    settings: tuple[PlannedSetting, ...]
    shard: tuple[int, int] | None = None
    #: every benchmark and target of the config, resolved (nothing read or built)
    benchmarks: tuple[PlannedBenchmark, ...] = ()
    targets: tuple[PlannedTarget, ...] = ()
    #: the detector of each (detector label, benchmark name, seed) this process's settings use
    detectors: Mapping[tuple[str, str, int], PlannedDetector] = dataclasses.field(
        default_factory=dict
    )
    procedure: Procedure | None = None

    @property
    def to_build(self) -> tuple[Artefact, ...]:
        return tuple(a for a in self.artefacts if not a.built)

    def lab_dir(self, spec: str) -> Path | None:
        """The directory of lab ``spec`` when it is built here, else None."""
        return resolve_lab(spec, build=False, root=self.cache_root)

    def planned_detectors(self, label: str) -> list[PlannedDetector]:
        """The plan's detectors of config entry ``label``, one per benchmark (its lowest seed)."""
        out: dict[str, PlannedDetector] = {}
        for d in sorted(self.detectors.values(), key=lambda d: (d.benchmark, d.seed)):
            if d.entry.label == label:
                out.setdefault(d.benchmark, d)
        return list(out.values())

    def setting(self, setting_id: str) -> PlannedSetting:
        """The planned setting of that id (KeyError for one not in the grid)."""
        for p in self.grid:
            if p.id == setting_id:
                return p
        raise KeyError(setting_id)

    def detector(self, planned: PlannedSetting) -> PlannedDetector:
        """The resolved detector of one of the settings this process runs (``settings``; a
        setting of another shard has none here: KeyError)."""
        if planned.detector is None:
            raise KeyError(planned.id)
        return planned.detector

    def describe(self) -> list[str]:
        """The plan as the dry run prints it: its settings, what it builds first, and every
        benchmark, target and detector (per benchmark and seed) as resolved."""
        part = "" if self.shard is None else f" (shard {self.shard[0]}/{self.shard[1]})"
        stored = sum(
            holds_setting(p.directory / RESULT_FILE, p.setting_hash) for p in self.settings
        )
        resumed = (
            f": {stored} complete (kept unless their inputs changed), "
            f"{len(self.settings) - stored} to compute"
            if stored
            else ""
        )
        lines = [
            f"plan: {len(self.settings)} of {len(self.grid)} setting(s){part} into "
            f"{self.run_dir}{resumed}"
        ]
        lines += [f"  {a.describe()}" for a in self.artefacts]
        lines += [f"  {b.describe()}" for b in self.benchmarks]
        lines += [f"  {t.describe()}" for t in self.targets]
        lines += [f"  {d.describe()}" for d in self.detectors.values()]
        return lines


# --------------------------------------------------------------------------------------------
# resolve, materialize
# --------------------------------------------------------------------------------------------


def _lab_users(cfg: ExperimentConfig, spec: str) -> tuple[str, ...]:
    users = [f"benchmarks[{i}]" for i, b in enumerate(cfg.benchmarks) if b.lab == spec]
    users += [f"targets[{i}]" for i, t in enumerate(cfg.targets) if t.lab == spec]
    for i, d in enumerate(cfg.detectors):
        if any(
            v.startswith((f"lab:{spec}/", f"{_CLEAN_REFERENCE}{spec}"))
            for v in option_strings(d.options)
        ):
            users.append(f"detectors[{i}]")
    return tuple(users)


def _artefacts(cfg: ExperimentConfig, root: Path) -> tuple[Artefact, ...]:
    out: list[Artefact] = []
    for spec, ref in cfg.labs.items():
        if isinstance(ref, LabRef):
            out.append(
                Artefact("lab", spec, ref.key, ref.directory, ref.built, _lab_users(cfg, spec))
            )
    seen: set[str] = set()
    for d in cfg.detectors:
        for v in option_strings(d.options):
            if not v.startswith(_CLEAN_REFERENCE) or v in seen:
                continue
            seen.add(v)
            spec = v[len(_CLEAN_REFERENCE) :]
            lab = resolve_lab(spec, build=False, root=root)
            unbuilt = unbuilt_clean_references(v, root=root)
            directory = None
            if lab is not None:
                from calibdcd.lab.clean_reference import clean_reference_dir

                directory = str(clean_reference_dir(lab, cache_dir=root))
            users = tuple(
                f"detectors[{j}]"
                for j, e in enumerate(cfg.detectors)
                if v in option_strings(e.options)
            )
            out.append(
                Artefact(
                    "clean reference", spec, v, directory, lab is not None and not unbuilt, users
                )
            )
    return tuple(out)


def _awaiting(cfg: ExperimentConfig, s: Setting, root: Path) -> str | None:
    """What setting ``s`` needs that is not built here (then its inputs hash): a lab (named by
    its content key), else a lab's clean reference LM; None when everything is."""
    missing = [r.key for r in labs_of(cfg, s.benchmark, s.target, s.detector) if not r.built]
    if missing:
        return "lab-not-built:" + ",".join(missing)
    untrained = unbuilt_clean_references(dict(s.detector.options), root=root)
    if untrained:
        return "reference-not-built:" + ",".join(untrained)
    return None


def _plan_settings(
    cfg: ExperimentConfig,
    planned: tuple[PlannedSetting, ...],
    mine: set[str],
    benchmarks: tuple[PlannedBenchmark, ...],
    targets: tuple[PlannedTarget, ...],
    detectors: dict[tuple[str, str, int], PlannedDetector],
    root: Path,
) -> tuple[PlannedSetting, ...]:
    """``planned`` with each setting's benchmark, target, detector (this process's settings
    only: the others' are not resolved), split and awaiting filled in; detectors resolved once
    per (label, benchmark name, seed) into ``detectors``."""
    by_bench = {b.entry.label: b for b in benchmarks}
    by_target = {t.entry.name: t for t in targets}
    procedure = Procedure.of(cfg)
    awaiting: dict[tuple[str, str, str], str | None] = {}
    out = []
    for p in planned:
        s = p.setting
        bench = by_bench[s.benchmark.label]
        det = None
        if p.id in mine:
            seed = detector_seed(cfg.detector_seed, s.seed)
            key = (s.detector.label, bench.name, seed)
            if key not in detectors:
                detectors[key] = plan_detector(s.detector, bench.name, seed, str(root))
            det = detectors[key]
        wkey = (s.benchmark.label, s.target.name, s.detector.label)
        if wkey not in awaiting:
            awaiting[wkey] = _awaiting(cfg, s, root)
        planned_setting = dataclasses.replace(
            p, benchmark=bench, target=by_target[s.target.name], detector=det,
            split=bench.split, procedure=procedure, awaiting=awaiting[wkey],
        )  # fmt: skip
        out.append(planned_setting)
    return tuple(out)


def resolve(
    cfg: ExperimentConfig,
    out: str | Path | None = None,
    *,
    shard: tuple[int, int] | None = None,
) -> RunPlan:
    """The plan of a run of ``cfg`` into ``out`` (default: :func:`default_run_dir`), building
    nothing."""
    run_dir = Path(out) if out is not None else default_run_dir(cfg)
    root = cache_root(cfg.cache_dir)
    bare = tuple(
        PlannedSetting(s, setting_hash(s, cfg), run_dir / "settings" / s.id) for s in grid(cfg)
    )
    mine = {p.id for p in shard_of(list(bare), shard)}
    # only what this process's settings use (a shard builds no lab of another shard's targets)
    used = {
        spec
        for p in bare
        if p.id in mine
        for spec in entry_labs(p.setting.benchmark, p.setting.target, p.setting.detector)
    }
    benchmarks = tuple(_planned_benchmark(b, cfg, root) for b in cfg.benchmarks)
    targets = tuple(plan_target(t, root) for t in cfg.targets)
    detectors: dict[tuple[str, str, int], PlannedDetector] = {}
    planned = _plan_settings(cfg, bare, mine, benchmarks, targets, detectors, root)
    return RunPlan(
        config=cfg,
        run_dir=run_dir,
        cache_root=root,
        artefacts=tuple(a for a in _artefacts(cfg, root) if a.spec in used),
        grid=planned,
        settings=tuple(p for p in planned if p.id in mine),
        shard=shard,
        benchmarks=benchmarks,
        targets=targets,
        detectors=detectors,
        procedure=Procedure.of(cfg),
    )


def _filled(plan: RunPlan) -> RunPlan:
    """``plan`` once its artefacts are built: each "not yet" filled (the artefacts' state, the
    lab targets' paths, the detectors that named a lab file, the settings' ``awaiting``);
    everything the plan had resolved is kept as it was."""
    cfg, root = plan.config, plan.cache_root
    specs = {a.spec for a in plan.artefacts}
    targets = tuple(t if t.built else plan_target(t.entry, root) for t in plan.targets)
    benchmarks = tuple(
        b if b.built else _planned_benchmark(b.entry, cfg, root) for b in plan.benchmarks
    )
    detectors = {
        key: d
        if d.config is not None and not _names_a_lab(d.entry)
        else plan_detector(_configured(plan, d.entry.label), d.benchmark, d.seed, str(root))
        for key, d in plan.detectors.items()
    }
    mine = {p.id for p in plan.settings}
    bare = tuple(
        dataclasses.replace(p, benchmark=None, target=None, detector=None) for p in plan.grid
    )
    grid_ = _plan_settings(cfg, bare, mine, benchmarks, targets, detectors, root)
    return dataclasses.replace(
        plan,
        artefacts=tuple(a for a in _artefacts(cfg, root) if a.spec in specs),
        grid=grid_,
        settings=tuple(p for p in grid_ if p.id in mine),
        benchmarks=benchmarks,
        targets=targets,
        detectors=detectors,
    )


def _names_a_lab(entry: DetectorEntry) -> bool:
    return any(v.startswith(("lab:", _CLEAN_REFERENCE)) for v in option_strings(entry.options))


def _configured(plan: RunPlan, label: str) -> DetectorEntry:
    return next(d for d in plan.config.detectors if d.label == label)


def materialize(
    plan: RunPlan, *, progress: bool = True, log: Callable[[str], None] | None = None
) -> RunPlan:
    """Build every artefact of ``plan`` that is not built (labs first: a clean reference is
    trained from its lab), each under its lock; returns the plan with its "not yet" fields
    filled (:func:`_filled`)."""
    if not plan.to_build:
        return plan
    say = log or (lambda s: None)
    for a in plan.to_build:
        if a.kind == "lab":
            say(f"building {a.describe()}")
            resolve_lab(a.spec, build=True, root=plan.cache_root, progress=progress)
    for a in plan.to_build:
        if a.kind == "clean reference":
            say(f"training {a.describe()}")
            resolve_lab_refs(a.key, build=True, root=plan.cache_root, progress=progress)
    return _filled(plan)
